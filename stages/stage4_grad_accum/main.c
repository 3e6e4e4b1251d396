/* stage4 — gradient accumulation under DDP: K micro-batches per optimizer step, all-reduced once.
 *
 *   make stage4 && ./stage4            (./stage4 --help for every flag)
 *
 * What you will learn:
 *   - how to train with a K× larger batch in the memory of one micro-batch;
 *   - what no_sync saves: one all-reduce per optimizer step instead of K;
 *   - what counts as a step once steps have micro-steps (the schedule, checkpoints, the timings).
 *
 * One optimizer step is what a PyTorch DDP user writes to train with a K× larger batch in the same
 * memory, in each of N processes:
 *     for i, (x, y) in enumerate(loader):
 *         last = (i + 1) % K == 0 or i + 1 == len(loader)
 *         with (nullcontext() if last else ddp_model.no_sync()):
 *             (F.cross_entropy(ddp_model(x), y) / K).backward()
 *         if last: optimizer.step(); optimizer.zero_grad()
 * Compared with stage 3 (diff the two files): the loop runs micro-steps; all but the last of each
 * group run inside no_sync (ddp_set_sync), so their gradients only add up in the flat gradient
 * buffer; each micro-loss is divided by K; the group's last backward all-reduces the accumulated
 * buckets as it produces them; the optimizer steps and the gradients are zeroed once per group.
 * --steps, the LR schedule and checkpoints count optimizer steps. Everything else is stage 3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#include "syncbn.h"
#include "trainer.h"

static const char *ABOUT =
    "stage4: DistributedDataParallel training of ResNet-18 (CIFAR layout) with gradient accumulation:\n"
    "--accum-steps micro-batches per optimizer step, gradients all-reduced once per step (no_sync for the others).\n"
    "usage: ./stage4 [options]            spawns --nproc-per-node workers of itself (like torchrun)\n"
    "       STAGE_RDZV_SECRET=$(openssl rand -hex 32) torchrun --no-python --nproc-per-node 2 ./stage4 [options]\n"
    "                                     (or srun / mpirun: every rank needs the same STAGE_RDZV_SECRET)\n"
    "       ./stage4 --show-sampler --dataset-size N --world-size R --rank r [--epoch e] [--seed s]";

int main(int argc, char **argv) {
    /* Stage 3's flags plus the accumulation's own. */
    TrainConfig cfg;
    DdpFlags f;
    config_defaults(&cfg);
    cfg.accum_steps = 4;
    const Option accum[] = {
        {"accum-steps", OPT_INT, &cfg.accum_steps, 1, 65536, NULL,
         "micro-batches per optimizer step (gradient accumulation): effective batch = K × --batch-size × "
         "world size"},
        {"sync-each-micro-step", OPT_FLAG, &f.sync_each_micro_step, 0, 0, NULL,
         "accumulate WITHOUT no_sync, all-reducing after every micro-step (the experiment): the same result, "
         "K× the all-reduces"},
        {NULL, 0, NULL, 0, 0, NULL, NULL},
    };
    cli_parse(argc, argv, config_options(&cfg, ddp_options(&f, accum)), "stage4", ABOUT);
    if (f.show.show) return sampler_show(&f.show, (uint64_t)cfg.seed, !f.no_shuffle, f.drop_last);
    TrainConfig check = cfg;
    config_resolve(&check, 0, 0); /* bad paths fail here, once, not in every worker */

    /* The job: one process per GPU. Without RANK & co. in the environment this call is the
     * launcher — it starts the workers (before any CUDA call) and never returns. */
    LaunchConfig lc = {.nproc_per_node = f.nproc_per_node, .nnodes = f.nnodes, .node_rank = f.node_rank,
                       .master_addr = f.master_addr, .master_port = f.master_port, .standalone = f.standalone,
                       .device = cfg.device, .comm = f.comm, .report = cfg.report, .trace = cfg.trace, .save = cfg.save,
                       .train_size = data_train_size(&check), .drop_last = f.drop_last,
                       .data_bytes = data_host_bytes(&check)};
    Worker w;
    launch_or_join(argc, argv, &lc, &w);

    /* This worker's device: GPU local_rank, or the CPU backend. */
    int gpus = strcmp(cfg.device, "cpu") ? device_cuda_count() : 0, cuda;
    CommKind comm_kind;
    launch_resolve(&lc, w.launcher, gpus, w.local_world_size, &cuda, &comm_kind);
    config_resolve(&cfg, cuda, w.rank == 0); /* rank 0 saves */
    Device dev = {.deterministic = cfg.deterministic, .benchmark = cfg.cudnn_benchmark,
                  .allow_tf32 = !cfg.no_tf32};
    device_init(&dev, cuda ? DEV_CUDA : DEV_CPU, w.rank, cuda ? launch_gpu_of(&w, gpus) : 0);
    if (w.rank == 0 && !cuda && !strcmp(lc.device, "auto"))
        printf("note: no CUDA GPU visible — %d CPU workers on the CPU backend (%s)\n", w.world_size,
               cli_cpu_fallback_what());
    int node_gpus = launch_node_gpus(w.launcher, gpus, w.local_world_size); /* srun's: one per task */
    if (w.rank == 0 && cuda && w.local_world_size > node_gpus)
        printf("note: %d workers share %d GPU(s) through --comm host: the DDP mechanics are all here, but the "
               "timings do not show scaling\n", w.local_world_size, node_gpus);

    /* Rendezvous (rank 0 hosts the store), then the communicator built over it. */
    Store *store = store_open(w.master_addr, w.master_port, w.rank, w.world_size, f.rdzv_timeout);
    store_set_timeout(store, f.comm_timeout);
    Comm *comm = comm_create(comm_kind, store, &dev, f.comm_timeout);

    /* Data, model, optimizer. */
    Dataset train_set, test_set;
    data_open(&cfg, &train_set, &test_set);
    Model *model = model_create(&dev, cfg.model, !strcmp(cfg.norm, "bn"), cfg.batch_size, cfg.seed);
    if (f.sync_bn) sync_batchnorm_convert(model, comm, w.rank, w.world_size); /* nn.SyncBatchNorm */
    Optimizer opt;
    optim_init_named(&opt, cfg.optimizer, &dev, model->n_param_floats, cfg.lr, cfg.momentum, cfg.weight_decay);

    /* Each rank reads only its DistributedSampler shard: places rank, rank + R, … of the epoch's order */
    int64_t shard = sampler_shard_size(train_set.n, w.world_size, f.drop_last);
    int64_t *indices = xmalloc((size_t)shard * sizeof(int64_t));
    LoaderConfig train_cfg = loader_config(&cfg, cfg.batch_size, 1);
    LoaderConfig test_cfg = loader_config(&cfg, cfg.batch_size, 0);
    Loader *train_loader = loader_create(&train_set, &train_cfg, &dev);
    Loader *test_loader = loader_create(&test_set, &test_cfg, &dev);
    InputPipe train_in, test_in;
    input_init(&train_in, &dev, train_loader, cfg.batch_size);
    input_init(&test_in, &dev, test_loader, cfg.batch_size);
    int64_t batches = (shard + cfg.batch_size - 1) / cfg.batch_size; /* the shard's, not the whole set's */
    StepLog log, eval_log;
    steplog_init(&log, &dev, (int)batches);
    steplog_init(&eval_log, &dev, (int)loader_batches_per_epoch(test_loader));
    /* Plan every convolution for the batch sizes we will see (the last batch may be short). */
    model_prepare(model, cfg.batch_size);
    if (shard % cfg.batch_size) model_prepare(model, (int)(shard % cfg.batch_size));
    int64_t test_shard = sampler_num_real(test_set.n, w.world_size, w.rank); /* evaluated by this rank */
    if (test_shard % cfg.batch_size) model_prepare(model, (int)(test_shard % cfg.batch_size));

    Device *devs[1] = {&dev};
    Run run;
    run_begin(&run, &cfg, "stage4", devs, 1, w.world_size, w.rank, comm_sum_across, comm, model, &opt, batches,
              train_set.source);
    /* DDP(model): same model everywhere, rank 0's weights broadcast, gradient buckets planned. */
    Ddp ddp;
    ddp_init(&ddp, &run, comm, &f);
    ddp_register_fused_optim(&ddp, &opt, 0); /* --optimizer-overlap (off: nothing; we step below) */
    const int K = cfg.accum_steps; /* micro-batches per optimizer step */

    if (cfg.evaluate) { /* --evaluate: test the --resume checkpoint's model, train nothing */
        double test_acc, test_loss;
        ddp_evaluate(&ddp, &test_in, test_set.n, &eval_log, &test_acc, &test_loss);
        run_evaluated(&run, test_acc, test_loss);
    }

    while (run.epoch < cfg.epochs && !run_done(&run)) {
        sampler_indices(train_set.n, w.world_size, w.rank, (uint64_t)cfg.seed, run.epoch, !f.no_shuffle,
                        f.drop_last, indices); /* sampler.set_epoch(epoch) */
        loader_start_epoch(train_loader, run.epoch, run.start_batch, indices, shard);
        float *x;
        int32_t *y;
        Batch *b;
        while (!run_done(&run) && (b = input_next(&train_in, &x, &y))) {
            /* micro-step `micro` of its group; the group's last — or the epoch's — synchronises */
            int micro = (int)(b->index % K), last = micro == K - 1 || b->index + 1 == batches;
            int slot = steplog_micro(&log, micro, b->n, K);
            if (micro == 0) model_zero_grad(model);
            ddp_set_sync(&ddp, last || f.sync_each_micro_step); /* else: with ddp_model.no_sync() */
            ddp_forward_begin(&ddp); /* BN buffers from rank 0, after a synchronised step */
            model_forward(model, b->n, x, 1);
            xent_forward_backward(&dev, b->n, model->classes, model_logits(model), y,
                                  1.0f / ((float)K * (float)b->n), &log.loss[slot], &log.correct[slot],
                                  model_dlogits(model)); /* loss / K */
            /* gradients add up in grad_flat; a synchronising backward all-reduces each bucket of the
             * sum as soon as it has produced that bucket's last gradient */
            model_backward(model, b->n, ddp_grad_ready, &ddp);
            ddp_backward_end(&ddp); /* the optimizer waits for the averaged gradients */
            if (!last) continue;
            clip_grad_norm(&run.clip, model->grad_flat); /* --clip-grad-norm: nn.utils.clip_grad_norm_ */
            if (!ddp.fused_optim) optim_step(&opt, model->param_flat, model->grad_flat, run_lr(&run));
            run_step_end(&run, &log, slot, b->index);
        }
        input_drain(&train_in);
        double wait = loader_take_wait_seconds(train_loader);
        double test_acc, test_loss; /* each rank its shard of the test set, the sums all-reduced */
        ddp_evaluate(&ddp, &test_in, test_set.n, &eval_log, &test_acc, &test_loss);
        run_epoch_end(&run, &log, test_acc, test_loss, wait);
        ddp_epoch_end(&ddp);
    }
    ddp_finish(&ddp);
    run_finish(&run);

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
    return run_exit_code(&run); /* 0, or 128 + the signal that stopped it early (--save) */
}
