/* stage2 — torch.nn.DataParallel: one process, one thread per GPU, one interpreter lock.
 *
 *   make stage2 && ./stage2            (./stage2 --help for every flag)
 *
 * What you will learn:
 *   - what nn.DataParallel does inside one step: scatter the batch, replicate the model, run the
 *     replicas in threads, gather the outputs, and reduce the gradients onto GPU0;
 *   - why it is often slower than one GPU: every step starts new replica threads whose per-thread
 *     convolution plan caches are empty, so each re-plans every forward convolution; every step
 *     re-copies the model; and every replica's Python serialises on one interpreter lock (the GIL);
 *   - why GPU0 needs more memory than the others (the whole batch, the logits, the master and its
 *     optimizer state: one buffer for SGD's momentum, two for --optimizer adam).
 * This stage branches from stage 1 (diff the two files); stage 3 (DDP) also branches from stage 1:
 * it replaces DataParallel rather than extending it.
 *
 * The loop is stage 1's, with the model wrapped as a PyTorch user wraps it:
 *     model = nn.DataParallel(model)       # and then, unchanged:
 *     optimizer.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); optimizer.step()
 * Inside model(x) and loss.backward() DataParallel scatters the batch from GPU0, replicates the model
 * onto every GPU, runs each replica's forward in a new thread (each op's Python holding the GIL,
 * each convolution planned again by that thread),
 * gathers the logits on GPU0, and after backward sums every replica's gradients into GPU0's. Those
 * steps are spelled out below, one call each (common/dp.h), and timed by phase. The lesson — why
 * this is slower than one GPU, and why GPU0 needs more memory — is in README.md beside this file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "device.h"
#include "dp.h"
#include "loader.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "trainer.h"

static const char *ABOUT =
    "stage2: torch.nn.DataParallel training of ResNet-18 (CIFAR layout) on N GPUs (or N virtual CPU\n"
    "devices), with CPython's GIL modelled. --batch-size is per device: the global batch is N times it.";

int main(int argc, char **argv) {
    TrainConfig cfg;
    config_defaults(&cfg);
    DpConfig dpc = dp_config_defaults();
    cli_parse(argc, argv, config_options(&cfg, dp_options(&dpc)), "stage2", ABOUT);

    /* The devices: N logical devices, GPUs (or virtual CPU devices). Device 0 holds the whole batch,
     * the master model, the loss and the optimizer. */
    Device opts = {.deterministic = cfg.deterministic, .benchmark = cfg.cudnn_benchmark,
                   .allow_tf32 = !cfg.no_tf32};
    DeviceKind kind = device_kind_from_flag(cfg.device, 0);
    config_resolve(&cfg, kind == DEV_CUDA, 1); /* the one process: it saves */
    dp_config_resolve(&dpc, kind);
    int n = dpc.gpus;
    Device **devs = dp_devices_create(n, kind, &opts);
    Device *dev = devs[0];
    int global = n * cfg.batch_size; /* --batch-size is per device, as in stage 1 */

    /* Data, one model per device (device 0's is the master), optimizer on device 0 only. */
    Dataset train_set, test_set;
    data_open(&cfg, &train_set, &test_set);
    Model *models[DP_MAX_DEVICES];
    for (int i = 0; i < n; i++)
        models[i] = model_create(devs[i], cfg.model, !strcmp(cfg.norm, "bn"), cfg.batch_size, cfg.seed);
    Model *model = models[0];
    Optimizer opt;
    optim_init_named(&opt, cfg.optimizer, dev, model->n_param_floats, cfg.lr, cfg.momentum, cfg.weight_decay);

    LoaderConfig train_cfg = loader_config(&cfg, global, 1);
    LoaderConfig test_cfg = loader_config(&cfg, cfg.batch_size, 0);
    Loader *train_loader = loader_create(&train_set, &train_cfg, dev);
    Loader *test_loader = loader_create(&test_set, &test_cfg, dev);
    InputPipe train_in, test_in;
    input_init(&train_in, dev, train_loader, global); /* the whole batch lands on device 0 */
    input_init(&test_in, dev, test_loader, cfg.batch_size);
    int64_t batches = loader_batches_per_epoch(train_loader);
    StepLog log, eval_log;
    steplog_init(&log, dev, (int)batches);
    steplog_init(&eval_log, dev, (int)loader_batches_per_epoch(test_loader));
    DataParallel dp;
    dp_init(&dp, devs, n, models, global, (int)batches, &dpc);
    /* Plan every convolution for the chunk sizes each replica will see (the last batch may be short),
     * and the master's for evaluation. */
    dp_prepare(&dp, global);
    if (train_set.n % global) dp_prepare(&dp, (int)(train_set.n % global));
    model_prepare(model, cfg.batch_size);
    if (test_set.n % cfg.batch_size) model_prepare(model, (int)(test_set.n % cfg.batch_size));

    Run run;
    run_begin(&run, &cfg, "stage2", devs, n, n, 0, NULL, NULL, model, &opt, batches, train_set.source);
    dp_describe(&dp, &run.report);

    if (cfg.evaluate) { /* --evaluate: test the --resume checkpoint's model, train nothing */
        double test_acc, test_loss;
        evaluate(model, &test_in, &eval_log, &test_acc, &test_loss);
        run_evaluated(&run, test_acc, test_loss);
    }

    while (run.epoch < cfg.epochs && !run_done(&run)) {
        loader_start_epoch(train_loader, run.epoch, run.start_batch, NULL, 0);
        float *x;
        int32_t *y;
        Batch *b;
        while (!run_done(&run) && (b = input_next(&train_in, &x, &y))) {
            int slot = steplog_begin(&log, b->n);
            model_zero_grad(model);
            dp_scatter(&dp, x, b->n);   /* chunks of the batch from device 0 to the others */
            dp_replicate(&dp);          /* device 0's parameters and buffers broadcast to the others */
            dp_parallel_apply(&dp);     /* a thread per replica runs its forward, under the GIL */
            dp_gather(&dp);             /* the logits concatenated on device 0 */
            xent_forward_backward(dev, b->n, model->classes, dp.logits, y,
                                  1.0f / (float)b->n, &log.loss[slot], &log.correct[slot],
                                  dp.dlogits);
            dp_backward(&dp);           /* the logits' gradient scattered back; backward everywhere */
            dp_reduce_add(&dp);         /* every replica's gradients summed into device 0's */
            clip_grad_norm(&run.clip, model->grad_flat); /* --clip-grad-norm: nn.utils.clip_grad_norm_ */
            optim_step(&opt, model->param_flat, model->grad_flat, run_lr(&run));
            dp_step_end(&dp);           /* closes this step's phase timing */
            run_step_end(&run, &log, slot, b->index);
        }
        input_drain(&train_in);
        dp_epoch_end(&dp);
        double wait = loader_take_wait_seconds(train_loader);
        double test_acc, test_loss;
        evaluate(model, &test_in, &eval_log, &test_acc, &test_loss);
        run_epoch_end(&run, &log, test_acc, test_loss, wait);
    }
    dp_report(&dp, &run);
    run_finish(&run);

    dp_destroy(&dp);
    input_destroy(&train_in);
    input_destroy(&test_in);
    loader_destroy(train_loader);
    loader_destroy(test_loader);
    steplog_destroy(&log);
    steplog_destroy(&eval_log);
    optim_destroy(&opt);
    for (int i = 0; i < n; i++) model_destroy(models[i]);
    dataset_free(&train_set);
    dataset_free(&test_set);
    dp_devices_destroy(devs, n);
    return run_exit_code(&run); /* 0, or 128 + the signal that stopped it early (--save) */
}
