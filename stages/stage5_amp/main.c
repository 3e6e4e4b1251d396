/* stage5 — automatic mixed precision: autocast (fp16 or bf16) with a GradScaler, on top of DDP.
 *
 *   make stage5 && ./stage5            (./stage5 --help for every flag)
 *
 * One step is what a PyTorch AMP user writes (torch.amp), in each of N processes:
 *     scaler = torch.amp.GradScaler()                          # fp16; bf16 needs none
 *     for x, y in loader:
 *         optimizer.zero_grad()
 *         with torch.autocast("cuda", dtype=torch.float16):
 *             loss = F.cross_entropy(ddp_model(x), y)
 *         scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
 * Compared with the stage it builds on (diff the two files): the model is created under autocast
 * (model_create_mixed: conv/linear in the low type, fp32 master weights), the loss gradient is
 * scaled before backward (scaler_scale_loss), and the optimizer step goes through the scaler
 * (scaler_step: unscale, skip on inf/NaN; scaler_update: the new scale). Everything else is the
 * previous stage. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp.h"
#include "cli.h"
#include "comm.h"
#include "ddp.h"
#include "device.h"
#include "launch.h"
#include "loader.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "sampler.h"
#include "store.h"
#include "trainer.h"

static const char *ABOUT =
    "stage5: mixed-precision (autocast + GradScaler) DistributedDataParallel training of ResNet-18 (CIFAR\n"
    "layout): one process per GPU, conv/linear in fp16 or bf16, fp32 master weights.\n"
    "usage: ./stage5 [options]            spawns --nproc-per-node workers of itself (like torchrun)\n"
    "       torchrun --no-python --nproc-per-node 2 ./stage5 [options]   (or srun / mpirun)\n"
    "       ./stage5 --show-scaler FFIFF [--growth-interval N] [--init-scale S]   the GradScaler lesson\n"
    "       ./stage5 --show-sampler --dataset-size N --world-size R --rank r [--epoch e] [--seed s]";

typedef struct Stage3Flags {
    int nproc_per_node, nnodes, node_rank, master_port;
    const char *master_addr, *comm;
    double bucket_mb, rdzv_timeout, comm_timeout;
    int no_overlap, drop_last, no_shuffle;
    int show_sampler, world_size, rank;
    int64_t dataset_size, epoch;
} Stage3Flags;

/* --show-sampler: this rank's DistributedSampler indices for one epoch, on one line. */
static int show_sampler(const Stage3Flags *f, const TrainConfig *cfg) {
    if (f->dataset_size < 1) die_user("--show-sampler needs --dataset-size N (the length of the dataset)");
    if (f->rank >= f->world_size)
        die_user("--rank %d must be below --world-size %d (ranks are numbered from 0)", f->rank, f->world_size);
    int64_t n = sampler_num_samples(f->dataset_size, f->world_size, f->drop_last);
    int64_t *idx = xmalloc((size_t)(n + 1) * sizeof(int64_t));
    sampler_indices(f->dataset_size, f->world_size, f->rank, (uint64_t)cfg->seed, f->epoch, !f->no_shuffle,
                    f->drop_last, idx);
    for (int64_t i = 0; i < n; i++) printf(i ? " %lld" : "%lld", (long long)idx[i]);
    printf("\n");
    free(idx);
    return 0;
}

/* Stage 1's flags plus stage 3's own: torchrun's, DDP's, and the sampler lesson's. */
static void parse_flags(int argc, char **argv, TrainConfig *cfg, Stage3Flags *f, AmpConfig *amp) {
    config_defaults(cfg);
    amp_defaults(amp, "fp16");
    *f = (Stage3Flags){.nnodes = 1, .master_addr = "127.0.0.1", .master_port = 29500, .comm = "auto",
                        .bucket_mb = 25, .rdzv_timeout = 60, .comm_timeout = 300, .world_size = 1,
                        .dataset_size = -1};
    const double above0 = nextafter(0.0, INFINITY); /* shown as the open end of (0, …] */
    const Option extra[] = {
        {"nproc-per-node", OPT_INT, &f->nproc_per_node, 1, 1024, NULL,
         "worker processes on this node (torchrun --nproc-per-node); auto: one per visible GPU, 2 on the CPU"},
        {"nnodes", OPT_INT, &f->nnodes, 1, 65536, NULL, "machines in the job (torchrun --nnodes)"},
        {"node-rank", OPT_INT, &f->node_rank, 0, 65535, NULL,
         "this machine's number, 0 … nnodes−1 (torchrun --node-rank)"},
        {"master-addr", OPT_STR, &f->master_addr, 0, 0, NULL,
         "address of node 0, where rank 0 hosts the rendezvous store (torchrun --master-addr)"},
        {"master-port", OPT_INT, &f->master_port, 1, 65535, NULL,
         "TCP port of the rendezvous store (torchrun --master-port)"},
        {"comm", OPT_CHOICE, &f->comm, 0, 0, "auto|nccl|host",
         "all-reduce backend: nccl (GPUs), or host = a ring over TCP through host memory (CPU workers; GPU "
         "workers sharing a GPU), like gloo; auto: nccl on GPUs"},
        {"bucket-mb", OPT_FLOAT, &f->bucket_mb, above0, 1e6, NULL,
         "gradient bucket size in MiB (DistributedDataParallel bucket_cap_mb)"},
        {"no-overlap", OPT_FLAG, &f->no_overlap, 0, 0, NULL,
         "all-reduce all gradients once after backward instead of bucket by bucket during it (the experiment)"},
        {"drop-last", OPT_FLAG, &f->drop_last, 0, 0, NULL,
         "DistributedSampler(drop_last=True): drop the tail instead of padding every rank to the same length"},
        {"rdzv-timeout", OPT_FLOAT, &f->rdzv_timeout, 1, 3600, NULL, "seconds to wait for every rank to join"},
        {"comm-timeout", OPT_FLOAT, &f->comm_timeout, 1, 86400, NULL,
         "seconds before an unfinished collective counts as hung and the job is stopped "
         "(init_process_group timeout)"},
        {"show-sampler", OPT_FLAG, &f->show_sampler, 0, 0, NULL,
         "print one rank's DistributedSampler indices (with --dataset-size, --world-size, --rank, --epoch, "
         "--seed, --drop-last, --no-shuffle) and exit"},
        {"dataset-size", OPT_INT64, &f->dataset_size, 1, 1e12, NULL, "--show-sampler: dataset length N"},
        {"world-size", OPT_INT, &f->world_size, 1, 65536, NULL, "--show-sampler: number of ranks R"},
        {"rank", OPT_INT, &f->rank, 0, 65535, NULL, "--show-sampler: the rank whose indices to print"},
        {"epoch", OPT_INT64, &f->epoch, 0, 1e9, NULL, "--show-sampler: the epoch (sampler.set_epoch)"},
        {"no-shuffle", OPT_FLAG, &f->no_shuffle, 0, 0, NULL,
         "DistributedSampler(shuffle=False): indices in order"},
        {NULL, 0, NULL, 0, 0, NULL, NULL},
    };
    cli_parse(argc, argv, config_options(cfg, amp_options(amp, extra)), "stage5", ABOUT);
    amp_check(amp); /* bad AMP flag combinations fail here, once, not in every worker */
}

int main(int argc, char **argv) {
    TrainConfig cfg;
    Stage3Flags f;
    AmpConfig amp;
    parse_flags(argc, argv, &cfg, &f, &amp);
    if (amp.show_scaler[0]) return amp_show_scaler(&amp);
    if (f.show_sampler) return show_sampler(&f, &cfg);
    TrainConfig check = cfg;
    config_resolve(&check, 0); /* bad paths fail here, once, not in every worker */

    /* The job: one process per GPU. Without RANK & co. in the environment this call is the
     * launcher — it starts the workers (before any CUDA call) and never returns. */
    LaunchConfig lc = {.nproc_per_node = f.nproc_per_node, .nnodes = f.nnodes, .node_rank = f.node_rank,
                       .master_addr = f.master_addr, .master_port = f.master_port, .device = cfg.device,
                       .comm = f.comm};
    Worker w;
    launch_or_join(argc, argv, &lc, &w);

    /* This worker's device: GPU local_rank, or the CPU backend. */
    int gpus = strcmp(cfg.device, "cpu") ? device_cuda_count() : 0, cuda;
    CommKind comm_kind;
    launch_resolve(&lc, w.launcher, gpus, w.local_world_size, &cuda, &comm_kind);
    config_resolve(&cfg, cuda);
    Device dev = {.deterministic = cfg.deterministic, .benchmark = cfg.cudnn_benchmark,
                  .allow_tf32 = !cfg.no_tf32};
    device_init(&dev, cuda ? DEV_CUDA : DEV_CPU, w.rank, cuda ? launch_gpu_of(&w, gpus) : 0);
    Precision prec = amp_precision(&amp, &dev); /* autocast's low type (bf16 needs sm80+) */
    if (w.rank == 0 && !cuda && !strcmp(lc.device, "auto"))
        printf("note: no CUDA GPU visible — %d CPU workers on the CPU backend (small model, small dataset)\n",
               w.world_size);
    if (w.rank == 0 && cuda && w.local_world_size > gpus)
        printf("note: %d workers share %d GPU(s) through --comm host: the DDP mechanics are all here, but the "
               "timings do not show scaling\n", w.local_world_size, gpus);

    /* Rendezvous (rank 0 hosts the store), then the communicator built over it. */
    Store *store = store_open(w.master_addr, w.master_port, w.rank, w.world_size, f.rdzv_timeout);
    store_set_timeout(store, f.comm_timeout);
    Comm *comm = comm_create(comm_kind, store, &dev, f.comm_timeout);

    /* Data, model, optimizer. */
    Dataset train_set, test_set;
    data_open(&cfg, &train_set, &test_set);
    Model *model = model_create_mixed(&dev, cfg.model, !strcmp(cfg.norm, "bn"), cfg.batch_size, cfg.seed, prec,
                                      amp.channels_last);
    Optimizer opt;
    optim_init(&opt, &dev, model->n_param_floats, cfg.lr, cfg.momentum, cfg.weight_decay);

    /* Each rank reads only its DistributedSampler shard: indices rank, rank + R, rank + 2R, … */
    int64_t shard = sampler_num_samples(train_set.n, w.world_size, f.drop_last);
    if (shard < 1)
        die_user("--drop-last with %lld samples and %d ranks leaves no sample per rank", (long long)train_set.n,
                 w.world_size);
    int64_t *indices = xmalloc((size_t)shard * sizeof(int64_t));
    LoaderConfig train_cfg = loader_config(&cfg, cfg.batch_size, 1);
    LoaderConfig test_cfg = loader_config(&cfg, cfg.batch_size, 0);
    Loader *train_loader = loader_create(&train_set, &train_cfg, &dev);
    Loader *test_loader = loader_create(&test_set, &test_cfg, &dev);
    InputPipe train_in, test_in;
    input_init(&train_in, &dev, train_loader, cfg.batch_size);
    input_init(&test_in, &dev, test_loader, cfg.batch_size);
    int64_t batches = (shard + cfg.batch_size - 1) / cfg.batch_size;
    StepLog log, eval_log;
    steplog_init(&log, &dev, (int)batches);
    steplog_init(&eval_log, &dev, (int)loader_batches_per_epoch(test_loader));
    /* Plan every convolution for the batch sizes we will see (the last batch may be short). */
    model_prepare(model, cfg.batch_size);
    if (shard % cfg.batch_size) model_prepare(model, (int)(shard % cfg.batch_size));
    if (test_set.n % cfg.batch_size) model_prepare(model, (int)(test_set.n % cfg.batch_size));

    Device *devs[1] = {&dev};
    Run run;
    run_begin(&run, &cfg, "stage5", devs, 1, w.world_size, w.rank, comm_sum_across, comm, model, &opt, batches,
              train_set.source);
    GradScaler scaler; /* torch.amp.GradScaler(); disabled for bf16 and off */
    scaler_init(&scaler, &dev, &amp, prec, w.rank, run.total_steps);
    /* DDP(model): same model everywhere, rank 0's weights broadcast, gradient buckets planned. */
    Ddp ddp;
    ddp_init(&ddp, &run, comm, f.bucket_mb, !f.no_overlap);

    while (run.epoch < cfg.epochs && !run_done(&run)) {
        sampler_indices(train_set.n, w.world_size, w.rank, (uint64_t)cfg.seed, run.epoch, !f.no_shuffle,
                        f.drop_last, indices); /* sampler.set_epoch(epoch) */
        loader_start_epoch(train_loader, run.epoch, run.start_batch, indices, shard);
        float *x;
        int32_t *y;
        Batch *b;
        while (!run_done(&run) && (b = input_next(&train_in, &x, &y))) {
            int slot = steplog_begin(&log, b->n);
            launch_step(run.step + 1); /* where this rank is, for the launcher's failure report */
            model_zero_grad(model);
            ddp_forward_begin(&ddp); /* BN buffers from rank 0 */
            model_forward(model, b->n, x, 1);
            xent_forward_backward(&dev, b->n, model->classes, model_logits(model), y,
                                  1.0f / (float)b->n, &log.loss[slot], &log.correct[slot],
                                  model_dlogits(model));
            scaler_scale_loss(&scaler, model_dlogits(model), (int64_t)b->n * model->classes); /* scaler.scale(loss) */
            /* each bucket's all-reduce starts as soon as backward has produced its gradients */
            model_backward(model, b->n, ddp_grad_ready, &ddp);
            ddp_backward_end(&ddp); /* the optimizer waits for the averaged gradients */
            /* scaler.step(optimizer): unscale, skip if any (all-reduced) gradient is inf/NaN */
            scaler_step(&scaler, &opt, model->param_flat, model->grad_flat, model->n_param_floats, run_lr(&run));
            scaler_update(&scaler);
            run_step_end(&run, &log, slot, b->index);
        }
        input_drain(&train_in);
        double wait = loader_take_wait_seconds(train_loader);
        double test_acc, test_loss;
        ddp_sync_buffers(&ddp);
        evaluate(model, &test_in, &eval_log, &test_acc, &test_loss);
        run_epoch_end(&run, &log, test_acc, test_loss, wait);
        ddp_epoch_end(&ddp);
    }
    ddp_finish(&ddp);
    scaler_report(&scaler, &amp, prec, &run.report, run.sum_across, run.sum_ctx); /* scale, skipped steps */
    run_finish(&run);

    scaler_destroy(&scaler);
    ddp_destroy(&ddp);
    input_destroy(&train_in);
    input_destroy(&test_in);
    loader_destroy(train_loader);
    loader_destroy(test_loader);
    steplog_destroy(&log);
    steplog_destroy(&eval_log);
    optim_destroy(&opt);
    model_destroy(model);
    dataset_free(&train_set);
    dataset_free(&test_set);
    free(indices);
    comm_destroy(comm);
    store_close(store);
    device_destroy(&dev);
    return 0;
}
