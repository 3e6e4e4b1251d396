/* stage1 — train ResNet-18 on one GPU (or on the CPU backend): the loop every later stage builds on.
 *
 *   make stage1 && ./stage1            (./stage1 --help for every flag)
 *
 * What you will learn:
 *   - the five calls of a training step (zero_grad, forward, loss, backward, optimizer step) and
 *     what each one runs on the device;
 *   - how batches reach the GPU without the GPU waiting (loader threads, a copy stream);
 *   - how to time a GPU step honestly (events on the stream, no added synchronisation).
 * Stages 2 (DataParallel) and 3 (DDP) each branch from this file: diff either against it to see
 * its idea alone. Stage 4 builds on stage 3, and stage 5 on stage 4.
 *
 * One step is what a PyTorch user writes:
 *     for x, y in loader:  x, y = x.cuda(), y.cuda()
 *         optimizer.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); optimizer.step()
 * Here each line is a call into common/: the loader builds batches on worker threads, InputPipe
 * copies them to the GPU on a second stream, the model runs cuDNN/cuBLAS/our kernels, and the fused
 * SGD kernel updates the flat parameter buffer. Nothing in the step waits for the GPU (but the loss
 * read back every --log-every steps), so the host runs ahead and the GPU never idles (unless the data
 * is late: see "data wait" in the report). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "device.h"
#include "loader.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "trainer.h"

static const char *ABOUT =
    "stage1: single-device training of ResNet-18 (CIFAR layout) on synthetic data or CIFAR-10.";

int main(int argc, char **argv) {
    TrainConfig cfg;
    config_defaults(&cfg);
    cli_parse(argc, argv, config_options(&cfg, NULL), "stage1", ABOUT);

    /* The device: a GPU when one is visible (or --device cuda), else the CPU backend. */
    Device dev = {.deterministic = cfg.deterministic, .benchmark = cfg.cudnn_benchmark,
                  .allow_tf32 = !cfg.no_tf32};
    DeviceKind kind = device_kind_from_flag(cfg.device, 0);
    config_resolve(&cfg, kind == DEV_CUDA, 1); /* the one process: it saves */
    device_init(&dev, kind, 0, 0);

    /* Data, model, optimizer. */
    Dataset train_set, test_set;
    data_open(&cfg, &train_set, &test_set);
    Model *model = model_create(&dev, cfg.model, !strcmp(cfg.norm, "bn"), cfg.batch_size, cfg.seed);
    Optimizer opt;
    optim_init_named(&opt, cfg.optimizer, &dev, model->n_param_floats, cfg.lr, cfg.momentum, cfg.weight_decay);

    LoaderConfig train_cfg = loader_config(&cfg, cfg.batch_size, 1);
    LoaderConfig test_cfg = loader_config(&cfg, cfg.batch_size, 0);
    Loader *train_loader = loader_create(&train_set, &train_cfg, &dev);
    Loader *test_loader = loader_create(&test_set, &test_cfg, &dev);
    InputPipe train_in, test_in;
    input_init(&train_in, &dev, train_loader, cfg.batch_size);
    input_init(&test_in, &dev, test_loader, cfg.batch_size);
    int64_t batches = loader_batches_per_epoch(train_loader);
    StepLog log, eval_log;
    steplog_init(&log, &dev, (int)batches);
    steplog_init(&eval_log, &dev, (int)loader_batches_per_epoch(test_loader));
    /* Plan every convolution for the batch sizes we will see (the last batch may be short). */
    model_prepare(model, cfg.batch_size);
    if (train_set.n % cfg.batch_size) model_prepare(model, (int)(train_set.n % cfg.batch_size));
    if (test_set.n % cfg.batch_size) model_prepare(model, (int)(test_set.n % cfg.batch_size));

    Device *devs[1] = {&dev};
    Run run;
    run_begin(&run, &cfg, "stage1", devs, 1, 1, 0, NULL, NULL, model, &opt, batches, train_set.source);

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
            model_forward(model, b->n, x, 1);
            xent_forward_backward(&dev, b->n, model->classes, model_logits(model), y,
                                  1.0f / (float)b->n, &log.loss[slot], &log.correct[slot],
                                  model_dlogits(model));
            model_backward(model, b->n, NULL, NULL);
            clip_grad_norm(&run.clip, model->grad_flat); /* --clip-grad-norm: nn.utils.clip_grad_norm_ */
            optim_step(&opt, model->param_flat, model->grad_flat, run_lr(&run));
            run_step_end(&run, &log, slot, b->index);
        }
        input_drain(&train_in);
        double wait = loader_take_wait_seconds(train_loader);
        double test_acc, test_loss;
        evaluate(model, &test_in, &eval_log, &test_acc, &test_loss);
        run_epoch_end(&run, &log, test_acc, test_loss, wait);
    }
    run_finish(&run);

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
    device_destroy(&dev);
    return run_exit_code(&run); /* 0, or 128 + the signal that stopped it early (--save) */
}
