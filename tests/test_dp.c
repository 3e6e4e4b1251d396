/* test_dp.c — DataParallel (common/dp.h, ./stage2): PyTorch's chunk rule, what replicate copies,
 * DP ≡ one device, batch norm's running statistics, device 0's extra memory, and ./stage2 end to
 * end on the CPU backend (and on CUDA logical devices when a GPU is visible). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "dp.h"
#include "model.h"
#include "clock.h"
#include "ops.h"
#include "optim.h"
#include "plan_cache.h"
#include "tests.h"

/* ---- the chunk rule ------------------------------------------------------------------------- */

START_TEST(scatter_chunks_follow_torch_chunk) {
    struct { int b, n, k, sizes[4]; } cases[] = {
        {10, 4, 4, {3, 3, 3, 1}}, /* ceil(10/4) = 3; the last takes the rest */
        {6, 4, 3, {2, 2, 2}},     /* fewer chunks than devices: device 3 idles */
        {3, 4, 3, {1, 1, 1}},
        {8, 2, 2, {4, 4}},
        {1, 4, 1, {1}},
        {7, 1, 1, {7}},
        {9, 3, 3, {3, 3, 3}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int sizes[DP_MAX_DEVICES];
        int k = dp_chunks(cases[c].b, cases[c].n, sizes);
        ck_assert_msg(k == cases[c].k, "(%d, %d): %d chunks, expected %d", cases[c].b, cases[c].n, k, cases[c].k);
        for (int i = 0; i < k; i++) ck_assert_int_eq(sizes[i], cases[c].sizes[i]);
    }
}
END_TEST

/* ---- one DataParallel step, and one stage-1 step, as the tests need them ------------------- */

typedef struct StepOut {
    float loss;
    float *params, *grads, *buffers; /* the master's after the step (host copies, malloc'd) */
    float *replica1_buffers;         /* replica 1's BN statistics after the step (n ≥ 2) */
    size_t peak[DP_MAX_DEVICES];
    int64_t np, nb;
} StepOut;

static void step_out_free(StepOut *o) {
    free(o->params), free(o->grads), free(o->buffers), free(o->replica1_buffers);
}

/* A fixed batch: images in [-2, 2), labels cycling through the classes. */
static void make_batch(int n, float *x, int32_t *y) {
    test_fill_uniform(x, (int64_t)n * IMG_PIXELS, 42, -2, 2);
    for (int i = 0; i < n; i++) y[i] = (i * 3 + 1) % NUM_CLASSES;
}

static float *to_host(Device *d, const void *src, size_t bytes) {
    float *h = malloc(bytes ? bytes : 4);
    if (bytes) device_copy_d2h(d, h, src, bytes);
    return h;
}

static Device opts_for(DeviceKind kind) {
    /* CUDA: plain fp32 and deterministic algorithms, so only summation order differs */
    return (Device){.deterministic = kind == DEV_CUDA, .allow_tf32 = 0};
}

/* One DataParallel forward + backward as stage 2's loop runs it, up to the summed gradient on device 0
 * (the caller steps the optimizer, if it wants, and calls dp_step_end). */
static void dp_forward_backward(DataParallel *dp, Model *master, const float *x, const int32_t *y, int batch,
                                float *loss, int32_t *correct) {
    model_zero_grad(master);
    dp_scatter(dp, x, batch);
    dp_replicate(dp);
    dp_parallel_apply(dp);
    dp_gather(dp);
    xent_forward_backward(dp->devs[0], batch, master->classes, dp->logits, y, 1.0f / (float)batch, loss, correct,
                          dp->dlogits);
    dp_backward(dp);
    dp_reduce_add(dp);
}

/* One SGD step (lr 0.1, momentum 0.9, wd 5e-4) of `arch` through DataParallel on n logical devices
 * with global batch `batch`, the loss's scale 1/batch. */
static void dp_one_step(DeviceKind kind, int n, int batch, const char *arch, int bn, const DpConfig *cfg,
                        StepOut *out) {
    Device opts = opts_for(kind);
    Device **devs = dp_devices_create(n, kind, &opts);
    Device *d0 = devs[0];
    int chunk = (batch + n - 1) / n;
    Model *models[DP_MAX_DEVICES];
    /* NCHW, as stage 2 runs (dp_config_resolve): the replicas run the model op by op */
    for (int i = 0; i < n; i++) models[i] = model_create_mixed(devs[i], arch, bn, chunk, 7, PREC_FP32, 0);
    Model *m = models[0];
    Optimizer opt;
    optim_init(&opt, d0, m->n_param_floats, 0.1, 0.9, 5e-4);
    DataParallel dp;
    dp_init(&dp, devs, n, models, batch, 4, cfg);
    dp_prepare(&dp, batch);
    float *xh = malloc((size_t)batch * IMG_PIXELS * sizeof(float));
    int32_t *yh = malloc((size_t)batch * sizeof(int32_t));
    make_batch(batch, xh, yh);
    float *x = xh, *loss = &out->loss;
    int32_t *y = yh, correct_h, *correct = &correct_h;
    if (kind == DEV_CUDA) {
        x = device_alloc(d0, (size_t)batch * IMG_PIXELS * sizeof(float), "x");
        y = device_alloc(d0, (size_t)batch * sizeof(int32_t), "y");
        loss = device_alloc(d0, sizeof(float), "loss");
        correct = device_alloc(d0, sizeof(int32_t), "correct");
        device_copy_h2d(d0, x, xh, (size_t)batch * IMG_PIXELS * sizeof(float));
        device_copy_h2d(d0, y, yh, (size_t)batch * sizeof(int32_t));
    }
    dp_forward_backward(&dp, m, x, y, batch, loss, correct);
    /* the summed gradient, before the optimizer reads it */
    out->np = m->n_param_floats, out->nb = m->n_buffer_floats;
    out->grads = to_host(d0, m->grad_flat, (size_t)out->np * sizeof(float));
    optim_step(&opt, m->param_flat, m->grad_flat, 0.1);
    dp_step_end(&dp);
    dp_epoch_end(&dp);
    out->params = to_host(d0, m->param_flat, (size_t)out->np * sizeof(float));
    out->buffers = to_host(d0, m->buffer_flat, (size_t)out->nb * sizeof(float));
    out->replica1_buffers = n > 1 ? to_host(devs[1], models[1]->buffer_flat, (size_t)out->nb * sizeof(float)) : NULL;
    if (kind == DEV_CUDA) {
        device_copy_d2h(d0, &out->loss, loss, sizeof(float));
        device_free(d0, x), device_free(d0, y), device_free(d0, loss), device_free(d0, correct);
    }
    for (int i = 0; i < n; i++) out->peak[i] = devs[i]->mem_peak;
    dp_destroy(&dp);
    optim_destroy(&opt);
    for (int i = 0; i < n; i++) model_destroy(models[i]);
    dp_devices_destroy(devs, n);
    free(xh), free(yh);
}

/* The same step as stage 1 takes it: one device, the whole batch. */
static void ref_one_step(DeviceKind kind, int batch, const char *arch, int bn, StepOut *out) {
    DpConfig none = dp_config_defaults();
    none.op_us = 0, none.host_us = 0;
    dp_one_step(kind, 1, batch, arch, bn, &none, out); /* one device: DataParallel calls the module */
}

/* The one-device path is stage 1's loop exactly; check that once against model_forward directly. */
START_TEST(dp_on_one_device_is_stage1) {
    StepOut a;
    ref_one_step(DEV_CPU, 6, "tiny", 1, &a);
    Device d = {0};
    device_init(&d, DEV_CPU, 0, -1);
    Model *m = model_create(&d, "tiny", 1, 6, 7);
    Optimizer opt;
    optim_init(&opt, &d, m->n_param_floats, 0.1, 0.9, 5e-4);
    float *x = malloc(6 * IMG_PIXELS * sizeof(float)), loss;
    int32_t y[6], correct;
    make_batch(6, x, y);
    model_zero_grad(m);
    model_forward(m, 6, x, 1);
    xent_forward_backward(&d, 6, 10, model_logits(m), y, 1.0f / 6, &loss, &correct, model_dlogits(m));
    model_backward(m, 6, NULL, NULL);
    optim_step(&opt, m->param_flat, m->grad_flat, 0.1);
    ck_assert(loss == a.loss);
    ck_assert(!memcmp(m->param_flat, a.params, (size_t)a.np * sizeof(float)));
    ck_assert(!memcmp(m->buffer_flat, a.buffers, (size_t)a.nb * sizeof(float)));
    free(x);
    optim_destroy(&opt);
    model_destroy(m);
    device_destroy(&d);
    step_out_free(&a);
}
END_TEST

/* DP on n devices with global batch B ≡ one device with batch B (--norm none, so the chunks do not
 * see different batch statistics). The CPU backend computes logits per sample, so the loss is the
 * same bit for bit; the parameter gradients are the same per-sample terms summed in a different
 * order — (Σ chunk 0) + (Σ chunk 1) + … against one running sum — so they agree to float32
 * rounding: each of the ≤ 8 additions may round differently by half an ulp (ε = 1.2e-7) of a
 * partial sum no larger than max |g|·(a few), so 1e-6 of max |g| bounds it (we see ~5e-8). The
 * first SGD step moves p by lr·(g + wd·p), so parameters agree to lr·1e-6·max|g| plus one rounding
 * of p itself (|p| < 1: 1e-7). */
static void check_dp_equals_one_device(DeviceKind kind, int n, int batch, double grad_tol, double loss_tol) {
    DpConfig cfg = dp_config_defaults();
    cfg.switch_ms = 0.1; /* short, so the modelled GIL actually switches during the test */
    StepOut a, b;
    dp_one_step(kind, n, batch, "tiny", 0, &cfg, &a);
    ref_one_step(kind, batch, "tiny", 0, &b);
    ck_assert_msg(fabsf(a.loss - b.loss) <= loss_tol * fabsf(b.loss), "n=%d: loss %.9g vs %.9g", n, a.loss, b.loss);
    ck_assert(a.np == b.np && a.np > 0);
    double gerr = test_rel_err(a.grads, b.grads, a.np);
    ck_assert_msg(gerr <= grad_tol, "n=%d batch=%d: gradients differ by %.3g of max|g|", n, batch, gerr);
    double gmax = 0, pdiff = 0;
    for (int64_t i = 0; i < a.np; i++) {
        gmax = test_max_nan(gmax, fabs(b.grads[i]));
        pdiff = test_max_nan(pdiff, fabs((double)a.params[i] - b.params[i]));
    }
    ck_assert_msg(pdiff <= 0.1 * grad_tol * gmax + 1e-7, "n=%d: parameters differ by %.3g (max|g| %.3g)", n, pdiff, gmax);
    step_out_free(&a), step_out_free(&b);
}

START_TEST(dp_equals_one_device_cpu) {
    check_dp_equals_one_device(DEV_CPU, 2, 8, 1e-6, 0); /* chunks 4, 4 */
    check_dp_equals_one_device(DEV_CPU, 3, 8, 1e-6, 0); /* chunks 3, 3, 2 */
    check_dp_equals_one_device(DEV_CPU, 4, 6, 1e-6, 0); /* chunks 2, 2, 2: device 3 idles */
}
END_TEST

/* ResNet-18 is larger than the reduce's landing bucket (DP_BUCKET_BYTES), so reduce_add goes bucket
 * by bucket, the last one partial: every gradient is still summed exactly once. (Batch 2, one
 * sample per device: a CPU step of ResNet-18 takes about a second.) */
START_TEST(dp_reduce_in_several_buckets_cpu) {
    ck_assert_int_gt(test_n_params("resnet18"), (int64_t)(DP_BUCKET_BYTES / sizeof(float)));
    DpConfig cfg = dp_config_defaults();
    StepOut a, b;
    dp_one_step(DEV_CPU, 2, 2, "resnet18", 0, &cfg, &a);
    ref_one_step(DEV_CPU, 2, "resnet18", 0, &b);
    ck_assert(a.np == b.np && a.np == test_n_params("resnet18"));
    double gerr = test_rel_err(a.grads, b.grads, a.np);
    ck_assert_msg(gerr <= 1e-5, "gradients differ by %.3g of max|g|", gerr);
    step_out_free(&a), step_out_free(&b);
}
END_TEST

/* On CUDA, cuDNN may pick different algorithms for a chunk than for the whole batch, and the loss
 * kernel reduces in another order, so besides the summation order the convolutions themselves round
 * differently (fp32, TF32 off, deterministic algorithms): 1e-4 of max |g|, as the CUDA-vs-CPU model
 * test allows, and 1e-5 on the loss. */
START_TEST(dp_equals_one_device_cuda) {
    if (!test_have_gpu("dp: DP ≡ one device on CUDA logical devices")) return;
    check_dp_equals_one_device(DEV_CUDA, 2, 16, 1e-4, 1e-5);
    check_dp_equals_one_device(DEV_CUDA, 3, 16, 1e-4, 1e-5);
}
END_TEST

/* Every way of moving data and running threads gives the same numbers, bit for bit. */
START_TEST(dp_variants_are_bit_identical) {
    DpConfig base = dp_config_defaults();
    StepOut ref;
    dp_one_step(DEV_CPU, 3, 7, "tiny", 1, &base, &ref);
    DpConfig v[3] = {base, base, base};
    v[0].thread_pool = 1;
    v[1].p2p = 0;
    v[2].op_us = 0, v[2].host_us = 0;
    for (int i = 0; i < 3; i++) {
        StepOut o;
        dp_one_step(DEV_CPU, 3, 7, "tiny", 1, &v[i], &o);
        ck_assert_msg(o.loss == ref.loss, "variant %d: loss", i);
        ck_assert_msg(!memcmp(o.params, ref.params, (size_t)o.np * sizeof(float)), "variant %d: params", i);
        ck_assert_msg(!memcmp(o.buffers, ref.buffers, (size_t)o.nb * sizeof(float)), "variant %d: buffers", i);
        step_out_free(&o);
    }
    step_out_free(&ref);
}
END_TEST

/* Batch norm: each replica normalises with its own chunk; the master keeps replica 0's running
 * statistics — exactly those of a forward over chunk 0 alone — and replica 1's are thrown away. */
START_TEST(dp_bn_running_stats_are_replica0s) {
    DpConfig cfg = dp_config_defaults();
    StepOut a;
    dp_one_step(DEV_CPU, 2, 8, "tiny", 1, &cfg, &a);
    Device d = {0};
    device_init(&d, DEV_CPU, 0, -1);
    Model *m = model_create(&d, "tiny", 1, 4, 7);
    float *x = malloc(8 * IMG_PIXELS * sizeof(float));
    int32_t y[8];
    make_batch(8, x, y);
    model_forward(m, 4, x, 1); /* chunk 0 */
    ck_assert(!memcmp(m->buffer_flat, a.buffers, (size_t)a.nb * sizeof(float)));
    model_forward(m, 4, x + 4 * IMG_PIXELS, 1); /* replica 1 saw chunk 1 after the same broadcast */
    Model *m1 = model_create(&d, "tiny", 1, 4, 7);
    model_forward(m1, 4, x + 4 * IMG_PIXELS, 1);
    ck_assert(!memcmp(m1->buffer_flat, a.replica1_buffers, (size_t)a.nb * sizeof(float)));
    ck_assert(memcmp(a.buffers, a.replica1_buffers, (size_t)a.nb * sizeof(float)));
    free(x);
    model_destroy(m), model_destroy(m1);
    device_destroy(&d);
    step_out_free(&a);
}
END_TEST

/* Device 0 holds the optimizer state, the gathered logits, the reduce's landing bucket: its peak is
 * above every other device's. */
START_TEST(dp_device0_peak_memory_is_highest) {
    DpConfig cfg = dp_config_defaults();
    int ns[2] = {2, 3};
    for (int t = 0; t < 2; t++) {
        StepOut a;
        dp_one_step(DEV_CPU, ns[t], 12, "tiny", 1, &cfg, &a);
        for (int i = 1; i < ns[t]; i++)
            ck_assert_msg(a.peak[0] > a.peak[i], "n=%d: device 0 peak %zu <= device %d's %zu", ns[t], a.peak[0], i, a.peak[i]);
        step_out_free(&a);
    }
}
END_TEST

/* What replicate copies every step, counted as nn.Module.modules() / parameters() + buffers() of
 * the PyTorch twin (tests/torch/models.py) counts them. */
START_TEST(dp_counts_modules_and_tensors_as_pytorch) {
    struct { const char *arch; int bn, modules, tensors; } c[] = {
        {"resnet18", 1, 62, 62 + 60}, /* 20 BN × (running_mean, running_var, num_batches_tracked) */
        {"resnet18", 0, 59, 22},  /* 20 convs + linear weight and bias; no BN */
        {"tiny", 1, 22, 23 + 21},
    };
    for (int i = 0; i < 3; i++) {
        Device d = {0};
        device_init(&d, DEV_CPU, 0, -1);
        Device *devs[1] = {&d};
        Model *m = model_create(&d, c[i].arch, c[i].bn, 1, 0);
        DataParallel dp;
        DpConfig cfg = dp_config_defaults();
        dp_init(&dp, devs, 1, &m, 1, 1, &cfg);
        ck_assert_msg(dp.n_modules == c[i].modules, "%s/%d: %d modules", c[i].arch, c[i].bn, dp.n_modules);
        ck_assert_msg(dp.n_tensors == c[i].tensors, "%s/%d: %d tensors", c[i].arch, c[i].bn, dp.n_tensors);
        dp_destroy(&dp);
        model_destroy(m);
        device_destroy(&d);
    }
}
END_TEST

/* ---- the modelled Python, charged as its costs say ------------------------------------------- */

/* One step of tiny (BN) on n CPU devices, global batch `batch`: what each phase charged as modelled
 * Python (ms), what dp_python_us says the step costs, and the counts the costs multiply. */
typedef struct PyStep {
    double ms[DP_PHASES], host_us, ops_us, scale;
    int k, modules, tensors, params, layers;
} PyStep;

static void python_of_one_step(int n, int batch, const DpConfig *cfg, PyStep *o) {
    Device opts = opts_for(DEV_CPU);
    Device **devs = dp_devices_create(n, DEV_CPU, &opts);
    int chunk = (batch + n - 1) / n;
    Model *models[DP_MAX_DEVICES];
    for (int i = 0; i < n; i++) models[i] = model_create_mixed(devs[i], "tiny", 1, chunk, 7, PREC_FP32, 0);
    Model *m = models[0];
    DataParallel dp;
    dp_init(&dp, devs, n, models, batch, 4, cfg);
    dp_prepare(&dp, batch);
    float *x = malloc((size_t)batch * IMG_PIXELS * sizeof(float)), loss;
    int32_t *y = malloc((size_t)batch * sizeof(int32_t)), correct;
    make_batch(batch, x, y);
    dp_forward_backward(&dp, m, x, y, batch, &loss, &correct);
    dp_step_end(&dp);
    for (int p = 0; p < DP_PHASES; p++) o->ms[p] = dp.py_ms[0][p];
    dp_python_us(&dp, batch, &o->host_us, &o->ops_us);
    o->scale = dp.host_scale, o->k = dp.k, o->modules = dp.n_modules, o->tensors = dp.n_tensors;
    o->params = m->n_params, o->layers = m->n_layers;
    dp_destroy(&dp);
    for (int i = 0; i < n; i++) model_destroy(models[i]);
    dp_devices_destroy(devs, n);
    free(x), free(y);
}

static void check_python_sums(const PyStep *o, double host_total_us, const char *what) {
    double sum = 0;
    for (int p = 0; p < DP_PHASES; p++) sum += o->ms[p];
    ck_assert_msg(fabs(1e3 * sum - (o->host_us + o->ops_us)) <= 1e-6 * (o->host_us + o->ops_us),
                  "%s: the phases charged %.6f ms, dp_python_us says %.6f + %.6f µs", what, sum, o->host_us, o->ops_us);
    ck_assert_msg(fabs(o->ops_us - o->k * o->layers * dp_config_defaults().op_us) <= 1e-6 * o->ops_us,
                  "%s: ops %.6f µs", what, o->ops_us);
    if (host_total_us >= 0)
        ck_assert_msg(fabs(o->host_us - host_total_us) <= 1e-6 * (host_total_us + 1), "%s: DataParallel's own Python "
                      "%.6f µs a step, --gil-host-us says %.6f", what, o->host_us, host_total_us);
}

/* Each phase charges DataParallel's Python as dp_python.c's costs count it (scatter, gather and the
 * backward's scatter one call each; replicate a call and every module and tensor of every replica;
 * parallel_apply a call, each new thread's start-up and every op of every replica; reduce-add a call
 * and every parameter of every replica), the phases together make dp_python_us's figure — the one the
 * describe line prints and --gil-host-us scales — and with --gil-host-us T DataParallel's own Python
 * is T µs a full step, thread start-ups included (0: none at all, only the ops). */
START_TEST(dp_charges_the_modelled_python_its_costs_say) {
    DpConfig cfg = dp_config_defaults();
    for (int pool = 0; pool < 2; pool++)
        for (int batch = 1; batch <= 8; batch += 7) { /* batch 1 on 2 devices: one chunk, no threads */
            cfg.thread_pool = pool;
            PyStep o;
            python_of_one_step(2, batch, &cfg, &o);
            char what[64];
            snprintf(what, sizeof what, "batch %d%s", batch, pool ? " --dp-thread-pool" : "");
            ck_assert_int_eq(o.k, batch == 1 ? 1 : 2);
            double call = cfg.call_us, k = o.k, want[DP_PHASES] = {0};
            want[DP_SCATTER] = want[DP_GATHER] = want[DP_BACKWARD] = call;
            want[DP_REPLICATE] = call + k * (o.modules * cfg.module_us + o.tensors * cfg.param_us);
            want[DP_FORWARD] = call + k * o.layers * cfg.op_us + (!pool && o.k > 1 ? k * cfg.thread_us : 0);
            want[DP_REDUCE] = call + k * o.params * cfg.param_us;
            for (int p = 0; p < DP_PHASES; p++)
                ck_assert_msg(fabs(o.ms[p] - 1e-3 * want[p]) <= 1e-9, "%s: phase %s charged %.6f ms of Python, "
                              "expected %.6f", what, dp_phase_name[p], o.ms[p], 1e-3 * want[p]);
            check_python_sums(&o, -1, what);
        }
    cfg.thread_pool = 0;
    double totals[2] = {1000, 0};
    for (int t = 0; t < 2; t++) {
        cfg.host_us = totals[t];
        PyStep o;
        python_of_one_step(2, 8, &cfg, &o);
        char what[64];
        snprintf(what, sizeof what, "--gil-host-us %g", totals[t]);
        check_python_sums(&o, totals[t], what);
        double ops = 1e-3 * o.ops_us, host = 0;
        for (int p = 0; p < DP_PHASES; p++) host += o.ms[p];
        host -= ops;
        ck_assert_msg(fabs(host - 1e-3 * totals[t]) <= 1e-9, "%s: the phases charged %.6f ms of DataParallel's "
                      "own Python", what, host);
    }
}
END_TEST

/* replicate broadcasts the buffers too (torch's replicate copies them): each step a replica's BN
 * statistics start from the master's. After one step from a fresh model both starts are the same
 * (dp_bn_running_stats_are_replica0s cannot tell); here the master's statistics have moved first,
 * as in any later step, so replica 1 must end with the master's updated by chunk 1 alone. */
START_TEST(dp_replicate_broadcasts_the_buffers) {
    DpConfig cfg = dp_config_defaults();
    cfg.op_us = 0, cfg.host_us = 0;
    Device opts = opts_for(DEV_CPU);
    Device **devs = dp_devices_create(2, DEV_CPU, &opts);
    Model *models[2];
    for (int i = 0; i < 2; i++) models[i] = model_create_mixed(devs[i], "tiny", 1, 4, 7, PREC_FP32, 0);
    float *x0 = malloc(4 * IMG_PIXELS * sizeof(float)), *x = malloc(8 * IMG_PIXELS * sizeof(float)), loss;
    int32_t y[8], correct;
    test_fill_uniform(x0, 4 * IMG_PIXELS, 5, -1, 3);
    model_forward(models[0], 4, x0, 1); /* an earlier step moved the master's statistics */
    make_batch(8, x, y);
    DataParallel dp;
    dp_init(&dp, devs, 2, models, 8, 4, &cfg);
    dp_prepare(&dp, 8);
    dp_forward_backward(&dp, models[0], x, y, 8, &loss, &correct);
    dp_step_end(&dp);
    Device d = {0};
    device_init(&d, DEV_CPU, 0, -1);
    Model *ref = model_create(&d, "tiny", 1, 4, 7);
    model_forward(ref, 4, x0, 1);
    model_forward(ref, 4, x + 4 * IMG_PIXELS, 1); /* the broadcast statistics, then chunk 1 */
    size_t nb = (size_t)ref->n_buffer_floats * sizeof(float);
    ck_assert_msg(!memcmp(ref->buffer_flat, models[1]->buffer_flat, nb),
                  "replica 1's BN statistics did not start from the master's: replicate skipped the buffers?");
    model_destroy(ref);
    device_destroy(&d);
    dp_destroy(&dp);
    for (int i = 0; i < 2; i++) model_destroy(models[i]);
    dp_devices_destroy(devs, 2);
    free(x0), free(x);
}
END_TEST

/* ---- the per-thread plan cache ------------------------------------------------------------- */

/* A cache plans a (conv, batch size) once: the first call misses and takes at least the charge,
 * the next hits; another batch size is another plan. What it computes is conv_forward's. */
START_TEST(plan_cache_plans_each_conv_once) {
    Device d = {0};
    device_init(&d, DEV_CPU, 0, -1);
    Conv c = {0};
    conv_shape(&c.s, 3, 4, 3, 1, 1, 8, 8);
    float x[2 * 3 * 64], w[4 * 3 * 9], y[2 * 4 * 64], ref[2 * 4 * 64];
    test_fill_uniform(x, 2 * 3 * 64, 1, -1, 1);
    test_fill_uniform(w, 4 * 3 * 9, 2, -1, 1);
    conv_forward(&d, &c, 2, x, w, ref);
    PlanCache pc;
    plan_cache_init(&pc, 2000); /* 2 ms per plan */
    double t0 = time_now();
    plan_cache_conv_forward(&pc, &d, &c, 2, x, w, y);
    double miss_s = time_now() - t0;
    ck_assert(!memcmp(y, ref, sizeof y));
    ck_assert(pc.misses == 1 && pc.hits == 0);
    ck_assert_msg(miss_s >= 2e-3 && pc.own_s + pc.charged_s >= 2e-3 * 0.999, "a miss took %.3f ms", 1e3 * miss_s);
    plan_cache_conv_forward(&pc, &d, &c, 2, x, w, y);
    ck_assert(pc.misses == 1 && pc.hits == 1);
    plan_cache_conv_forward(&pc, &d, &c, 1, x, w, y); /* batch 1: not planned yet */
    ck_assert(pc.misses == 2 && pc.hits == 1);
    ck_assert(!memcmp(y, ref, 4 * 64 * sizeof(float))); /* sample 0 is the same either way */
    plan_cache_destroy(&pc);
    device_destroy(&d);
}
END_TEST

/* `steps` DataParallel steps of tiny on n CPU devices; misses[s][i]: replica i's plan-cache misses
 * in step s. The model has 7 convolutions. */
static void dp_plan_misses(int n, int batch, int thread_pool, int steps, int64_t misses[][DP_MAX_DEVICES]) {
    Device opts = opts_for(DEV_CPU);
    Device **devs = dp_devices_create(n, DEV_CPU, &opts);
    int chunk = (batch + n - 1) / n;
    Model *models[DP_MAX_DEVICES];
    for (int i = 0; i < n; i++) models[i] = model_create(devs[i], "tiny", 1, chunk, 7);
    DpConfig cfg = dp_config_defaults();
    cfg.thread_pool = thread_pool;
    cfg.plan_us = 100; /* the mechanism, not the cost: keep the test quick */
    DataParallel dp;
    dp_init(&dp, devs, n, models, batch, steps, &cfg);
    dp_prepare(&dp, batch);
    float *x = malloc((size_t)batch * IMG_PIXELS * sizeof(float));
    int32_t *y = malloc((size_t)batch * sizeof(int32_t)), correct;
    float loss;
    make_batch(batch, x, y);
    for (int s = 0; s < steps; s++) {
        dp_forward_backward(&dp, models[0], x, y, batch, &loss, &correct);
        dp_step_end(&dp);
        for (int i = 0; i < n; i++) misses[s][i] = i < dp.k ? dp.rep[i].plan_misses : -1;
    }
    dp_epoch_end(&dp);
    dp_destroy(&dp);
    for (int i = 0; i < n; i++) model_destroy(models[i]);
    dp_devices_destroy(devs, n);
    free(x), free(y);
}

/* PyTorch's behaviour: parallel_apply's threads are new every step, so every step each replica
 * plans each of its forward convolutions again. With persistent threads (--dp-thread-pool), or in
 * the main thread when there is one replica, only the first step plans. */
START_TEST(dp_new_threads_replan_every_step_the_pool_does_not) {
    enum { STEPS = 3, CONVS = 7 };
    int64_t m[STEPS][DP_MAX_DEVICES];
    dp_plan_misses(2, 8, 0, STEPS, m);
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < 2; i++) ck_assert_msg(m[s][i] == CONVS, "new threads, step %d, replica %d: %lld misses", s, i, (long long)m[s][i]);
    dp_plan_misses(3, 7, 0, STEPS, m); /* chunks 3, 3, 1 */
    for (int s = 0; s < STEPS; s++)
        for (int i = 0; i < 3; i++) ck_assert_int_eq(m[s][i], CONVS);
    dp_plan_misses(2, 8, 1, STEPS, m);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(m[0][i], CONVS);
        for (int s = 1; s < STEPS; s++) ck_assert_msg(m[s][i] == 0, "pool, step %d, replica %d: %lld misses", s, i, (long long)m[s][i]);
    }
    dp_plan_misses(1, 8, 0, STEPS, m); /* one device: the main thread's cache */
    ck_assert_int_eq(m[0][0], CONVS);
    for (int s = 1; s < STEPS; s++) ck_assert_int_eq(m[s][0], 0);
}
END_TEST

/* A replica's forward counts like model_forward's (model_count_forward): a chunk of a size dp_prepare
 * never planned is one unprepared forward, and a prepared size is none. Every replica's count ends up
 * in the master's — the model the summary reports — so a size missing on replica 1 alone shows too.
 * The e2e test runs every stage with all its sizes prepared and wants 0, which a replica forward that
 * counted nothing also gives. */
START_TEST(dp_counts_forwards_of_unprepared_chunks) {
    enum { N = 2 };
    Device opts = opts_for(DEV_CPU);
    Device **devs = dp_devices_create(N, DEV_CPU, &opts);
    Model *models[DP_MAX_DEVICES];
    for (int i = 0; i < N; i++) models[i] = model_create(devs[i], "tiny", 1, 4, 7);
    DpConfig cfg = dp_config_defaults();
    cfg.plan_us = 100; /* the mechanism, not the cost: keep the test quick */
    DataParallel dp;
    dp_init(&dp, devs, N, models, 8, 5, &cfg); /* five steps */
    dp_prepare(&dp, 8); /* chunks of 4 */
    float *x = malloc((size_t)8 * IMG_PIXELS * sizeof(float));
    int32_t y[8], correct;
    float loss;
    make_batch(8, x, y);
    dp_forward_backward(&dp, models[0], x, y, 8, &loss, &correct);
    dp_step_end(&dp);
    for (int i = 0; i < N; i++) ck_assert_int_eq(dp.rep[i].model->unprepared_forwards, 0);
    dp_forward_backward(&dp, models[0], x, y, 6, &loss, &correct); /* chunks of 3: never prepared */
    dp_step_end(&dp);
    ck_assert_msg(models[0]->unprepared_forwards == N && models[0]->unprepared_last == 3,
                  "the master counts %lld unprepared forwards, the last of %d; want one per replica, of 3",
                  (long long)models[0]->unprepared_forwards, models[0]->unprepared_last);
    ck_assert_int_eq(models[1]->unprepared_forwards, 0); /* handed over, not counted twice */
    dp_prepare(&dp, 6);
    dp_forward_backward(&dp, models[0], x, y, 6, &loss, &correct);
    dp_step_end(&dp);
    ck_assert_int_eq(models[0]->unprepared_forwards, N);
    /* batch 5 makes chunks of 3 and 2: replica 0's size is prepared, replica 1's is not — only its
     * forward counts, and it shows on the master */
    dp_forward_backward(&dp, models[0], x, y, 5, &loss, &correct);
    dp_step_end(&dp);
    ck_assert_msg(models[0]->unprepared_forwards == N + 1 && models[0]->unprepared_last == 2,
                  "replica 1's unprepared chunk of 2: the master counts %lld (want %d), the last of %d",
                  (long long)models[0]->unprepared_forwards, N + 1, models[0]->unprepared_last);
    /* the other way round: batch 3 prepares chunks of 2 and 1, so batch 2's chunks of 1 and 1 are
     * unprepared on replica 0 alone — the master's last size is its 1, not replica 1's earlier 2 */
    dp_prepare(&dp, 3);
    dp_forward_backward(&dp, models[0], x, y, 2, &loss, &correct);
    dp_step_end(&dp);
    ck_assert_msg(models[0]->unprepared_forwards == N + 2 && models[0]->unprepared_last == 1,
                  "replica 0's unprepared chunk of 1: the master counts %lld (want %d), the last of %d (want 1)",
                  (long long)models[0]->unprepared_forwards, N + 2, models[0]->unprepared_last);
    dp_epoch_end(&dp);
    dp_destroy(&dp);
    for (int i = 0; i < N; i++) model_destroy(models[i]);
    dp_devices_destroy(devs, N);
    free(x);
}
END_TEST

/* The CPU backend's virtual devices share the host's memory. Linux overcommits, so allocations that
 * each fit but together exceed what the kernel would hand out all succeed, and a run that fills their
 * pages is killed with no message (exit 137: `./stage2 --device cpu --model resnet18 --gpus 64` holds
 * ~0.67 GiB a device at the default batch, 43 GiB on a 23 GiB host). Two devices each asking for 60 %
 * of the available memory: the second is refused, naming the fix. Only one page of each is touched if
 * it is not, so the test cannot take the machine's memory. */
static void two_devices_past_available(void *arg) {
    (void)arg;
    Device **devs = dp_devices_create(2, DEV_CPU, &(Device){0});
    size_t each = (size_t)(0.6 * host_mem_available());
    for (int i = 0; i < 2; i++) {
        char *p = device_alloc(devs[i], each, "activations and their gradients (planned arena)");
        p[0] = 1;
    }
    printf("both allocations of %zu bytes returned\n", each);
}

START_TEST(dp_cpu_devices_together_past_host_memory_are_refused) {
    char *out = NULL;
    int st = test_run_captured(two_devices_past_available, NULL, &out);
    ck_assert_msg(st == 1 && strstr(out, "cpu1: cannot allocate") && strstr(out, "share the host's memory") &&
                      strstr(out, "hint: out of memory:") && strstr(out, "--gpus"),
                  "exit %d: %s", st, out);
    free(out);
}
END_TEST

/* ---- ./stage2 end to end -------------------------------------------------------------------- */

#define SMALL2 "--model tiny --train-size 512 --test-size 256 --batch-size 16 --progress off"

static int run_stage2(const char *args, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s/stage2 %s", test_root(), args);
    return test_run(cmd, out);
}

/* The number after "key": in the first line of type `type`. */
static double json_field(const char *rep, const char *type, const char *key) {
    char t[64], k[64];
    snprintf(t, sizeof t, "\"type\":\"%s\"", type);
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *line = strstr(rep, t);
    ck_assert_msg(line, "no %s record", type);
    const char *end = strchr(line, '\n');
    const char *p = strstr(line, k);
    ck_assert_msg(p && (!end || p < end), "%s record lacks %s", type, key);
    return atof(p + strlen(k));
}

/* A run's phases add up to its step time, its device 0 peaks above device 1 — when both replicas
 * plan the same algorithms (cuDNN's heuristics, or the CPU backend). Under --cudnn-benchmark each
 * replica's thread times the algorithms itself and may pick one with a larger workspace than device
 * 0's (seen once on an H200: 116.7 against 104.6 MB), as two PyTorch threads may; same_algos = 0
 * then skips the comparison. */
static void check_report(const char *path, int same_algos, double tol) {
    char *rep = test_slurp(path, NULL);
    ck_assert_msg(rep, "report %s not written", path);
    /* Each step's phases added up, the median over steps, against the median step time — not the
     * console's sum of per-phase medians (medians of parts need not add up to the median of the whole
     * on a busy machine), and not means: the two sets of timed steps are one step apart (dp_report),
     * so one slow step moves one mean alone (seen: 64.5 against 55.3 ms, 4 suites at once). */
    double sum = json_field(rep, "phases", "phase_step_ms"), step = json_field(rep, "phases", "step_ms");
    ck_assert_msg(fabs(sum - step) <= tol * step,
                  "a step's phases add up to %.3f ms (median), the step takes %.3f ms (allowed: ±%.0f%%)", sum, step,
                  100 * tol);
    const char *sum_line = strstr(rep, "\"type\":\"summary\"");
    ck_assert(sum_line);
    const char *s = strstr(sum_line, "\"peak_mem_bytes\":[");
    ck_assert(s);
    double p0 = atof(s + strlen("\"peak_mem_bytes\":[")), p1 = atof(strchr(s, ',') + 1);
    ck_assert_msg(p0 > p1 || !same_algos, "%s: device 0 peak %.0f <= device 1 peak %.0f", path, p0, p1);
    free(rep);
}

START_TEST(stage2_cpu_learns_and_phases_add_up) {
    char *dir = test_tmpdir(), args[1024], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(args, sizeof args, "--device cpu --gpus 2 " SMALL2 " --epochs 4 --lr 0.05 --log-every 1 --report %s", path);
    int rc = run_stage2(args, &out);
    ck_assert_msg(rc == 0, "stage2 failed (%d):\n%s", rc, out);
    ck_assert_msg(strstr(out, "DataParallel phases") && strstr(out, "adds up") && strstr(out, "GIL ("), "%s", out);
    char *rep = test_slurp(path, NULL);
    double first = 0, last = 0;
    int n = 0;
    double loss[64];
    for (char *p = rep; (p = strstr(p, "\"type\":\"step\"")); p++) loss[n++] = atof(strstr(p, "\"loss\":") + 7);
    ck_assert_int_eq(n, 64);
    for (int i = 0; i < 4; i++) first += loss[i] / 4, last += loss[n - 1 - i] / 4;
    ck_assert_msg(last < 0.8 * first, "loss did not fall: first %.4f last %.4f", first, last);
    ck_assert(json_field(rep, "summary", "world_size") == 2);
    ck_assert(strstr(rep, "\"type\":\"gil_thread\""));
    /* new threads every step: each plans tiny's 7 forward convolutions, every step */
    ck_assert_msg(json_field(rep, "phases", "plan_misses_per_thread") == 7, "%s", out);
    /* 7 × the calibrated 0.983 ms a cold thread's plan costs (dp_python.c, docs/stage2.md), written out */
    ck_assert(json_field(rep, "phases", "plan_ms_per_thread") >= 7 * 0.983 * 0.999);
    /* the phases partition each step, so they add up whatever each is charged: what pins where a
     * phase's marks sit is its modelled Python, spent on the wall clock between them (the CPU backend
     * times phases on the wall clock; a median of per-step times each ≥ its Python is ≥ theirs) */
    int with_python = 0;
    for (int p = 0; p < DP_PHASES; p++) {
        char key[40], pkey[48];
        snprintf(key, sizeof key, "%s_ms", dp_phase_name[p]);
        snprintf(pkey, sizeof pkey, "%s_python_ms", dp_phase_name[p]);
        double ms = json_field(rep, "phases", key), py = json_field(rep, "phases", pkey);
        with_python += py > 0;
        ck_assert_msg(ms >= 0.99 * py, "phase %s: %.3f ms measured, less than its %.3f ms of modelled Python — the "
                      "time is charged to another phase", dp_phase_name[p], ms, py);
    }
    ck_assert_msg(with_python >= 4, "only %d phases model Python (scatter, replicate, gather, reduce at least)",
                  with_python);
    ck_assert_msg(json_field(rep, "summary", "ms_per_iter_median") > 0, "no timed step: the sum is compared with itself");
    /* the steps timed by phase: not the first WARMUP_STEPS, nor any epoch's first (it has no input phase
     * to measure) — 4 epochs of 16: (16 - WARMUP_STEPS) + 3 × 15; the GIL's line counts every step */
    ck_assert_msg(json_field(rep, "phases", "steps") == (16 - WARMUP_STEPS) + 3 * 15, "phases over %g steps",
                  json_field(rep, "phases", "steps"));
    ck_assert_msg(json_field(rep, "gil", "steps") == 64, "GIL over %g steps", json_field(rep, "gil", "steps"));
    free(rep);
    check_report(path, 1, 0.10);
    free(out), free(dir);
}
END_TEST

/* Over many steps, DataParallel ≡ one device, a short last batch included: 66 samples in batches of
 * 32 (8 per device × 4) end each epoch with a batch of 2, where devices 2 and 3 get no chunk — and their
 * gradients from the step before must not be added into the reduce (one step, as above, cannot show
 * it: a replica that never ran holds zeros). --norm none: the chunks see no batch statistics, so the
 * losses agree to float32 rounding of the gradients' summation order (a stale chunk's gradient moves
 * them by far more). */
START_TEST(stage2_cpu_short_last_batch_matches_stage1) {
    char *dir = test_tmpdir(), args[1024], a[512], b[512], *out;
    snprintf(a, sizeof a, "%s/s1.jsonl", dir), snprintf(b, sizeof b, "%s/s2.jsonl", dir);
    const char *run = "--device cpu --model tiny --norm none --train-size 66 --test-size 16 --epochs 3 --log-every 1 "
                      "--progress off";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/stage1 %s --batch-size 32 --report %s", test_root(), run, a);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "--gpus 4 --batch-size 8 %s --report %s", run, b); /* stage 2's batch is per device */
    ck_assert_msg(run_stage2(args, &out) == 0, "%s", out);
    free(out);
    double la[16], lb[16];
    ck_assert_int_eq(test_read_losses(a, la, 16), 9);
    ck_assert_int_eq(test_read_losses(b, lb, 16), 9);
    for (int i = 0; i < 9; i++)
        ck_assert_msg(fabs(la[i] - lb[i]) <= 1e-5 * fabs(la[i]), "step %d: stage 1 loss %.9g, stage 2 %.9g", i + 1,
                      la[i], lb[i]);
    free(dir);
}
END_TEST

START_TEST(stage2_cpu_variants_run) {
    char *dir = test_tmpdir(), args[1024], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(args, sizeof args, "--device cpu --gpus 3 " SMALL2 " --steps 12 --dp-thread-pool --p2p off "
             "--gil-switch-ms 0.2 --report %s", path);
    int rc = run_stage2(args, &out);
    ck_assert_msg(rc == 0, "stage2 failed (%d):\n%s", rc, out);
    ck_assert_msg(strstr(out, "persistent threads") && strstr(out, "--p2p off"), "%s", out);
    check_report(path, 1, 0.10);
    char *rep = test_slurp(path, NULL);
    ck_assert_msg(json_field(rep, "phases", "plan_misses_per_thread") == 0, "the pool's caches stay warm:\n%s", out);
    free(rep);
    free(out);
    snprintf(args, sizeof args, "--device cpu --gpus 2 " SMALL2 " --steps 8 --no-python --report %s", path);
    rc = run_stage2(args, &out);
    ck_assert_msg(rc == 0 && strstr(out, "GIL: never taken"), "stage2 --no-python (%d):\n%s", rc, out);
    free(out), free(dir);
}
END_TEST

/* --cudnn-benchmark on the CPU backend changes nothing, as the run's note says: a new thread's plans are
 * charged --dp-plan-us, not --dp-plan-bench-us (the CPU devices kept the flag, and each step was charged
 * 7 x 26.3 ms more per replica thread by default). Both charges given, far apart, to tell them apart. */
START_TEST(stage2_cpu_cudnn_benchmark_changes_no_charge) {
    char *dir = test_tmpdir(), args[1024], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(args, sizeof args, "--device cpu --gpus 2 --model tiny --train-size 64 --test-size 8 --batch-size 4 "
             "--steps 8 --progress off --cudnn-benchmark --dp-plan-us 100 --dp-plan-bench-us 5000 --report %s", path);
    int rc = run_stage2(args, &out);
    ck_assert_msg(rc == 0, "stage2 failed (%d):\n%s", rc, out);
    ck_assert_msg(strstr(out, "changes only GPU runs") && strstr(out, "a calibrated charge up to 100 µs (--dp-plan-us)"),
                  "the header names the charge without --cudnn-benchmark:\n%s", out);
    char *rep = test_slurp(path, NULL);
    double misses = json_field(rep, "phases", "plan_misses_per_thread"), ms = json_field(rep, "phases", "plan_ms_per_thread");
    ck_assert_msg(misses == 7, "each new thread plans the tiny model's 7 convolutions, got %g:\n%s", misses, out);
    ck_assert_msg(ms >= misses * 0.1 * 0.99 && ms < misses * 1.0, "planning %.3f ms a thread for %g plans: charged "
                  "at --dp-plan-us 100, not --dp-plan-bench-us 5000 (%.1f ms)\n%s", ms, misses, misses * 5.0, out);
    free(rep), free(out), free(dir);
}
END_TEST

/* --report holds what the header says of DataParallel: a "dp" record with the replicas, the forward's
 * threads, the copies and the modelled costs — without it the default's, the pool's and --no-python's
 * reports had the same records, and a script could not tell which run a "phases" record came from. */
START_TEST(stage2_report_records_the_dataparallel_settings) {
    char *dir = test_tmpdir(), args[1024], path[512], *out;
    struct { const char *flags, *forward; int replicas, p2p, python; double plan_us; } cases[] = {
        {"--gpus 2", "\"forward\":\"new threads\"", 2, 1, 1, 983},
        {"--gpus 3 --dp-thread-pool --p2p off --dp-plan-us 50", "\"forward\":\"thread pool\"", 3, 0, 1, 50},
        {"--gpus 2 --no-python", "\"forward\":\"new threads\"", 2, 1, 0, 983},
        {"--gpus 1", "\"forward\":\"main thread\"", 1, 1, 1, 983},
    };
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "--device cpu --model tiny --train-size 8 --test-size 4 --batch-size 2 --steps 1 "
                 "--progress off %s --report %s", cases[i].flags, path);
        int rc = run_stage2(args, &out);
        ck_assert_msg(rc == 0, "'%s' exited %d:\n%s", cases[i].flags, rc, out);
        char *rep = test_slurp(path, NULL);
        const char *rec = strstr(rep, "\"type\":\"dp\"");
        ck_assert_msg(rec, "'%s': no dp record:\n%s", cases[i].flags, rep);
        const char *end = strchr(rec, '\n'), *fw = strstr(rec, cases[i].forward);
        ck_assert_msg(fw && fw < end, "'%s': the dp record does not say %s:\n%s", cases[i].flags, cases[i].forward, rep);
        ck_assert_int_eq((int)json_field(rep, "dp", "replicas"), cases[i].replicas);
        ck_assert_int_eq((int)json_field(rep, "dp", "p2p"), cases[i].p2p);
        ck_assert_int_eq((int)json_field(rep, "dp", "python"), cases[i].python);
        ck_assert(json_field(rep, "dp", "plan_charge_us") == cases[i].plan_us);
        /* the header's "DataParallel's own X ms per step", and none without Python */
        double host = json_field(rep, "dp", "host_ms_per_step");
        char own[64];
        snprintf(own, sizeof own, "DataParallel's own %.2f ms per step", host);
        ck_assert_msg(cases[i].python ? strstr(out, own) != NULL : host == 0, "'%s': host_ms_per_step %g against:\n%s",
                      cases[i].flags, host, out);
        /* one device replicates nothing: its header must not say what replicate copies */
        if (cases[i].replicas == 1)
            ck_assert_msg(!strstr(out, "replicate copies") && strstr(out, "one device: scatter's call alone"),
                          "'%s': the header describes replicas one device does not have:\n%s", cases[i].flags, out);
        free(rep), free(out);
    }
    free(dir);
}
END_TEST

/* The forward's GIL wait is the mean over the replica threads, not their sum. On the CPU each
 * thread's wait lies inside the forward phase (both on the wall clock), so the mean can never
 * exceed the phase, step by step and so in the median. With four threads whose forward is mostly
 * modelled Python (1 ms an op, persistent threads: no planning), each waits for the other three's
 * Python: measured 0.60-0.66 of the phase on 2 cores, idle or loaded, so their sum is ~2.5 phases. */
START_TEST(stage2_cpu_gil_wait_is_per_thread) {
    char *dir = test_tmpdir(), args[1024], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(args, sizeof args, "--device cpu --gpus 4 --model tiny --train-size 512 --test-size 64 --batch-size 4 "
             "--steps 16 --progress off --gil-op-us 1000 --gil-switch-ms 0.5 --dp-thread-pool --report %s", path);
    ck_assert_msg(run_stage2(args, &out) == 0, "%s", out);
    char *rep = test_slurp(path, NULL);
    double fwd = json_field(rep, "phases", "forward_ms"), wait = json_field(rep, "phases", "forward_gil_wait_ms");
    ck_assert_msg(wait <= fwd * 1.001 + 0.01, "GIL wait %.3f ms per thread > forward %.3f ms: summed over threads?\n%s",
                  wait, fwd, out);
    /* Under a sanitizer (test_time_scale() > 1) the compute runs 5-15x slower and the modelled Python
     * does not, so the waits shrink to ~0.1 of the phase (ThreadSanitizer): only the bound above holds. */
    if (test_time_scale() == 1)
        ck_assert_msg(wait >= 0.3 * fwd, "GIL wait %.3f ms per thread < 0.3 x forward %.3f ms: four threads of "
                      "Python barely waited?\n%s", wait, fwd, out);
    free(rep), free(out), free(dir);
}
END_TEST

/* --optimizer adam: its two state buffers live on device 0 only. Against SGD (one momentum
 * buffer) device 0 holds one more model-sized buffer — and Adam's step count, one 512-byte block (as
 * torch's fused Adam keeps `step` on the device) — and device 1 holds exactly as much as before. */
START_TEST(stage2_adam_state_is_on_device0_only) {
    char *dir = test_tmpdir(), args[2048], path[2][512], *out;
    const char *opt[2] = {"--optimizer sgd", "--optimizer adam --lr 1e-3"};
    double p0[2], p1[2];
    for (int v = 0; v < 2; v++) {
        snprintf(path[v], sizeof path[v], "%s/r%d.jsonl", dir, v);
        snprintf(args, sizeof args, "--device cpu --gpus 2 " SMALL2 " --steps 3 %s --report %s", opt[v], path[v]);
        int rc = run_stage2(args, &out);
        ck_assert_msg(rc == 0, "stage2 %s failed (%d):\n%s", opt[v], rc, out);
        free(out);
        char *rep = test_slurp(path[v], NULL);
        const char *s = strstr(strstr(rep, "\"type\":\"summary\""), "\"peak_mem_bytes\":[");
        ck_assert(s);
        p0[v] = atof(s + strlen("\"peak_mem_bytes\":[")), p1[v] = atof(strchr(s, ',') + 1);
        free(rep);
    }
    double model_bytes = 512 * ceil(73370 * 4 / 512.0); /* tiny's 73,370 parameters, in 512-byte blocks */
    ck_assert_msg(p0[1] - p0[0] == model_bytes + 512, "device 0: adam %.0f vs sgd %.0f bytes", p0[1], p0[0]);
    ck_assert_msg(p1[1] == p1[0], "device 1: adam %.0f vs sgd %.0f bytes", p1[1], p1[0]);
    free(dir);
}
END_TEST

/* The phase table checks its sum against the step time measured apart from it: a run with no timed
 * step has none, and says so (it used to compare the sum with itself: "adds up (+0.0%)"). The
 * planning note describes the timed steps, not the last one (a 1-image last batch runs on the main
 * thread alone), and on one device names the main thread's cache; the header counts the replicas in
 * words ("1 replica", "2 replicas"). */
START_TEST(stage2_phase_notes_describe_what_was_measured) {
    char *dir = test_tmpdir(), args[1024], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(args, sizeof args, "--device cpu --model tiny --steps 6 --train-size 256 --test-size 64 --batch-size 16 "
             "--progress off --report %s", path);
    ck_assert_int_eq(run_stage2(args, &out), 0);
    ck_assert_msg(strstr(out, "vs step time: n/a (no step timed") && !strstr(out, "adds up"), "%s", out);
    free(out);
    char *rep = test_slurp(path, NULL);
    ck_assert_msg(rep && strstr(rep, "\"step_ms\":null") &&
                  strstr(rep, "\"adds_up\":null"), "%s", rep);
    free(rep);
    snprintf(args, sizeof args, "--device cpu --model tiny --gpus 2 --batch-size 8 --train-size 161 --test-size 16 "
             "--epochs 1 --progress off");
    ck_assert_int_eq(run_stage2(args, &out), 0);
    ck_assert_msg(strstr(out, "new threads every step start with empty caches") &&
                  !strstr(out, "the main thread's cache") && strstr(out, "DataParallel: 2 replicas on cpu0, cpu1 |"),
                  "%s", out);
    free(out);
    /* one device: every step's one chunk runs on the main thread, whose cache the note names */
    ck_assert_int_eq(run_stage2("--device cpu --model tiny --gpus 1 --batch-size 16 --train-size 256 --test-size 16 "
                                "--steps 8 --progress off", &out), 0);
    ck_assert_msg(strstr(out, "the main thread's cache") && !strstr(out, "new threads every step") &&
                  strstr(out, "DataParallel: 1 replica on cpu0 |"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* A run too short to time any phase (all warm-up) still counted the GIL every step: its table and
 * "gil" records come out — they used to be skipped with the phases, so a short run showed no GIL. */
START_TEST(stage2_short_run_still_reports_the_gil) {
    char *dir = test_tmpdir(), args[1024], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(args, sizeof args, "--device cpu --model tiny --gpus 2 --batch-size 8 --train-size 64 --test-size 16 "
             "--steps 3 --progress off --report %s", path);
    ck_assert_int_eq(run_stage2(args, &out), 0);
    ck_assert_msg(strstr(out, "too few steps to time") && strstr(out, "GIL (switch interval 5 ms)") &&
                  strstr(out, "replica 1"), "%s", out);
    char *rep = test_slurp(path, NULL);
    ck_assert_msg(rep && json_field(rep, "gil", "steps") == 3 && strstr(rep, "\"type\":\"gil_thread\""), "%s", rep);
    free(rep), free(out), free(dir);
}
END_TEST

/* --gpus 64, the most there may be: every device trains (a thread each, every step), the last
 * batch of 44 uses 44 of them, and the header's device list — cut at a line's length — says how many
 * it left out and which is the last, instead of ending at cpu58 under "64 replicas on". */
START_TEST(stage2_cpu_64_devices_run) {
    char *out;
    int rc = run_stage2("--device cpu --gpus 64 --model tiny --batch-size 2 --train-size 300 --test-size 16 "
                        "--epochs 1 --progress off", &out);
    ck_assert_msg(rc == 0, "stage2 --gpus 64 failed (%d):\n%s", rc, out);
    const char *line = strstr(out, "DataParallel: 64 replicas on cpu0, cpu1");
    ck_assert_msg(line, "%s", out);
    const char *end = strchr(line, '\n');
    ck_assert(end);
    char *head = strndup(line, (size_t)(end - line));
    ck_assert_msg(strstr(head, "more, to cpu63)"), "the device list does not reach cpu63: %s", head);
    free(head);
    ck_assert_msg(strstr(out, "peak memory cpu63"), "%s", out);
    free(out);
}
END_TEST

START_TEST(stage2_bad_flags_are_refused_clearly) {
    struct { const char *args, *expect; } cases[] = {
        {"--device cpu --gpus 0", "--gpus"},
        {"--device cpu --gpus 65", "--gpus"},
        {"--device cpu --gpus two", "--gpus"},
        {"--device cpu --gil-switch-ms 0", "--gil-switch-ms"},
        {"--device cpu --gil-op-us -1", "--gil-op-us"},
        {"--device cpu --gil-host-us -2", "--gil-host-us"},
        {"--device cpu --gil-host-us -0.5", "give -1 (the --gil-host-* costs as they are) or a total"},
        {"--device cpu --p2p maybe", "--p2p"},
        {"--device cpu --dp-thread-pool=1", "--dp-thread-pool"},
        {"--device cpu --dp-plan-us -1", "--dp-plan-us"},
        {"--device cpu --dp-plan-bench-us x", "--dp-plan-bench-us"},
        {"--device cpu --optimizer rmsprop", "--optimizer"},
        {"--device cpu --optimizer", "--optimizer"},
        {"--device cpu --optimizer adam --resume /etc/hostname", "not a checkpoint"},
        {"--device cpu --no-python --gil-op-us 10", "--no-python sets every modelled Python cost to 0, so --gil-op-us"},
        {"--device cpu --gil-host-param-us 3 --no-python", "--gil-host-param-us would be ignored"},
        /* a total of 0 scales every --gil-host-* cost to 0, as --no-python does */
        {"--device cpu --gil-host-us 0 --gil-host-thread-us 5", "--gil-host-us 0 scales every --gil-host-* cost to 0, "
                                                                "so --gil-host-thread-us would be ignored"},
        {"--device cpu --train-size 64 --gil-host-us 5 --gil-host-call-us 0 --gil-host-module-us 0 "
         "--gil-host-param-us 0 --gil-host-thread-us 0", "--gil-host-us"},
        /* one device: scatter's call is DataParallel's only Python, the other costs are not 0 but unused */
        {"--device cpu --train-size 64 --gpus 1 --gil-host-us 5 --gil-host-call-us 0",
         "with one device DataParallel's only own Python is scatter's call, and --gil-host-call-us is 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int rc = run_stage2(cases[i].args, &out);
        ck_assert_msg(rc == 2, "'%s' exited %d, expected 2:\n%s", cases[i].args, rc, out);
        ck_assert_msg(strstr(out, "error:") && strstr(out, cases[i].expect),
                      "'%s': message does not name '%s':\n%s", cases[i].args, cases[i].expect, out);
        free(out);
    }
}
END_TEST

/* With no Python modelled the GIL is never taken: a switch interval given would be ignored, and is
 * refused as --no-python refuses a cost (stage2_bad_flags_are_refused_clearly). */
START_TEST(stage2_switch_interval_without_python_is_refused) {
    const char *cases[] = {
        "--device cpu --train-size 16 --epochs 1 --no-python --gil-switch-ms 1",
        "--device cpu --train-size 16 --epochs 1 --gil-op-us 0 --gil-host-us 0 --gil-switch-ms 1",
        "--device cpu --train-size 16 --epochs 1 --gil-op-us 0 --gil-host-call-us 0 --gil-host-module-us 0 "
        "--gil-host-param-us 0 --gil-host-thread-us 0 --gil-switch-ms 1",
        /* the per-new-thread cost alone, where --dp-thread-pool starts no thread per step */
        "--device cpu --train-size 16 --epochs 1 --gil-op-us 0 --gil-host-call-us 0 --gil-host-module-us 0 "
        "--gil-host-param-us 0 --gil-host-thread-us 100 --dp-thread-pool --gil-switch-ms 1",
        /* one device: scatter's call is its only own Python (the other --gil-host-* costs are unused) */
        "--device cpu --train-size 16 --epochs 1 --gpus 1 --gil-op-us 0 --gil-host-call-us 0 --gil-switch-ms 1",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int rc = run_stage2(cases[i], &out);
        ck_assert_msg(rc == 2 && strstr(out, "error:") && strstr(out, "--gil-switch-ms would be ignored"),
                      "'%s' exited %d, expected 2 naming --gil-switch-ms:\n%s", cases[i], rc, out);
        free(out);
    }
    char *out; /* Python modelled somewhere: the interval matters */
    int rc = run_stage2("--device cpu --train-size 16 --epochs 1 --gil-op-us 0 --gil-switch-ms 1", &out);
    ck_assert_msg(rc == 0, "exited %d:\n%s", rc, out);
    free(out);
    /* without the interval the run goes on, and its header says why no Python is modelled */
    rc = run_stage2("--device cpu --train-size 16 --epochs 1 --gil-op-us 0 --gil-host-call-us 0 --gil-host-module-us 0 "
                    "--gil-host-param-us 0 --gil-host-thread-us 100 --dp-thread-pool", &out);
    ck_assert_msg(rc == 0 && strstr(out, "modelled Python: none (every --gil-* cost is 0 but --gil-host-thread-us"),
                  "exited %d, or the header does not say why:\n%s", rc, out);
    free(out);
    rc = run_stage2("--device cpu --train-size 16 --epochs 1 --no-python", &out);
    ck_assert_msg(rc == 0 && strstr(out, "modelled Python: none (--no-python)"), "exited %d:\n%s", rc, out);
    free(out);
    /* one device with its module, parameter and thread costs set: not "every --gil-* cost is 0" */
    rc = run_stage2("--device cpu --train-size 16 --epochs 1 --gpus 1 --gil-op-us 0 --gil-host-call-us 0", &out);
    ck_assert_msg(rc == 0 && strstr(out, "modelled Python: none (--gil-op-us is 0, and with one device DataParallel's "
                                         "only own Python is scatter's call, whose --gil-host-call-us is 0)"),
                  "exited %d, or the header does not say why:\n%s", rc, out);
    free(out);
}
END_TEST

/* tests/bench_stage2.sh's split row (--dp-thread-pool --no-python) runs with the flags the calibration
 * prints: --no-python refuses a --gil-* cost, so the row must pass only what it keeps. The row and its
 * flags are read from the script, with a calibration line as calibrate_dp.py prints it. */
START_TEST(stage2_bench_no_python_row_takes_the_calibrated_flags) {
    char *dir = test_tmpdir(), path[512], cmd[1024], *out;
    snprintf(path, sizeof path, "%s/row.sh", dir);
    FILE *f = fopen(path, "w");
    ck_assert(f);
    fprintf(f, "cd '%s' || exit 9\n"
               "DP_FLAGS='--gil-switch-ms 5 --gil-op-us 32.41 --gil-host-call-us 51.8 --gil-host-module-us 23.64 "
               "--gil-host-param-us 6.24 --gil-host-thread-us 125.4 --dp-plan-us 983.0 --dp-plan-bench-us 74723.4'\n"
               "eval \"$(grep -E '^NOPY_FLAGS=' tests/bench_stage2.sh)\"\n"
               "row=$(grep -E '^ *run stage2_pool_nopy ' tests/bench_stage2.sh | sed -E 's/.* stage2 //')\n"
               "[ -n \"$row\" ] || { echo 'no stage2_pool_nopy row in tests/bench_stage2.sh'; exit 9; }\n"
               "echo \"row: $row\"\n"
               "eval \"./stage2 --device cpu --model tiny --train-size 16 --test-size 16 --epochs 1 --progress off $row\"\n",
            test_root());
    fclose(f);
    snprintf(cmd, sizeof cmd, "bash '%s' 2>&1", path);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0, "bench_stage2.sh's --no-python row exited %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "charge up to 983 µs") && strstr(out, "modelled Python: none"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* A training set smaller than the devices: the summary's note names stage 2's count, --gpus — stage 2
 * has one process, and no ranks to lower. */
START_TEST(stage2_set_smaller_than_the_devices_names_gpus) {
    char *out;
    int rc = run_stage2("--device cpu --model tiny --gpus 4 --batch-size 1 --train-size 2 --test-size 16 --epochs 1 "
                        "--progress off", &out);
    ck_assert_msg(rc == 0, "exited %d:\n%s", rc, out);
    const char *note = strstr(out, "note: a full step is 4 images and the training set has 2");
    ck_assert_msg(note, "no note of the short set:\n%s", out);
    ck_assert_msg(strstr(note, "devices (--gpus 4)") && !strstr(note, "ranks"), "the note does not name --gpus:\n%s", out);
    free(out);
}
END_TEST

/* --help names each flag's PyTorch counterpart. Stage 2's --batch-size is per device, so its
 * DataLoader's batch_size is --gpus times it (DataParallel scatters that batch), and an optimizer
 * step takes one such batch on each device: "DataLoader batch_size" alone is stage 1's answer. */
START_TEST(stage2_help_batch_size_names_the_dataloader_batch) {
    TrainConfig cfg;
    config_defaults(&cfg);
    DpConfig dpc = dp_config_defaults();
    const Option *o = config_options(&cfg, dp_options(&dpc));
    while (o->name && strcmp(o->name, "batch-size")) o++;
    ck_assert_msg(o->name, "no --batch-size row");
    ck_assert_msg(strstr(o->help, "stage 2's one DataLoader batches --gpus times it") &&
                      strstr(o->help, "one such batch on each device"),
                  "--batch-size's help: %s", o->help);
}
END_TEST

/* On a GPU machine: two logical devices (two GPUs, or one shared), both copy paths. */
START_TEST(stage2_cuda_runs_and_phases_add_up) {
    if (!test_have_gpu("dp: ./stage2 on CUDA logical devices")) return;
    char *dir = test_tmpdir(), args[1024], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    /* the default plans through cuDNN's heuristics in every new thread; --cudnn-benchmark runs a
     * real cudnnFind search there (uncharged here, to keep the test short) */
    const char *variants[3] = {"", "--p2p off --dp-thread-pool", "--cudnn-benchmark --dp-plan-bench-us 0"};
    const double misses[3] = {7, 0, 7};
    for (int v = 0; v < 3; v++) {
        snprintf(args, sizeof args, "--device cuda --gpus 2 --model tiny --train-size 4096 --test-size 512 "
                 "--batch-size 64 --steps 40 --progress off %s --report %s", variants[v], path);
        int rc = run_stage2(args, &out);
        ck_assert_msg(rc == 0, "stage2 %s failed (%d):\n%s", variants[v], rc, out);
        /* ±25% on CUDA, where the two sets of steps are timed on a GPU that run_suites.sh's other lanes
         * share: their time slices delay one step here and one there (30.6 against 26.4 ms, one H100,
         * 4 suites at once: docs/logs/gpu_suites_H100_2026-12-07b.txt). A phase left out of the sum,
         * or counted twice, shows here only if it is a quarter of the step; the CPU runs above keep
         * the ±10% check. */
        check_report(path, v != 2, 0.25); /* v = 2: --cudnn-benchmark */
        char *rep = test_slurp(path, NULL);
        ck_assert_msg(json_field(rep, "phases", "plan_misses_per_thread") == misses[v], "%s:\n%s", variants[v], out);
        free(rep);
        free(out);
    }
    free(dir);
}
END_TEST

Suite *suite_dp(void) {
    Suite *s = suite_create("dp");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, scatter_chunks_follow_torch_chunk);
    tcase_add_test(tc, dp_counts_modules_and_tensors_as_pytorch);
    tcase_add_test(tc, dp_on_one_device_is_stage1);
    tcase_add_test(tc, dp_equals_one_device_cpu);
    tcase_add_test(tc, dp_reduce_in_several_buckets_cpu);
    tcase_add_test(tc, dp_equals_one_device_cuda);
    tcase_add_test(tc, dp_variants_are_bit_identical);
    tcase_add_test(tc, dp_bn_running_stats_are_replica0s);
    tcase_add_test(tc, dp_replicate_broadcasts_the_buffers);
    tcase_add_test(tc, dp_charges_the_modelled_python_its_costs_say);
    tcase_add_test(tc, dp_device0_peak_memory_is_highest);
    tcase_add_test(tc, plan_cache_plans_each_conv_once);
    tcase_add_test(tc, dp_new_threads_replan_every_step_the_pool_does_not);
    tcase_add_test(tc, dp_counts_forwards_of_unprepared_chunks);
    tcase_add_test(tc, dp_cpu_devices_together_past_host_memory_are_refused);
    suite_add_tcase(s, tc);
    TCase *e2e = tcase_create("stage2");
    tcase_set_timeout(e2e, 300);
    tcase_add_test(e2e, stage2_cpu_learns_and_phases_add_up);
    tcase_add_test(e2e, stage2_cpu_short_last_batch_matches_stage1);
    tcase_add_test(e2e, stage2_cpu_variants_run);
    tcase_add_test(e2e, stage2_cpu_cudnn_benchmark_changes_no_charge);
    tcase_add_test(e2e, stage2_report_records_the_dataparallel_settings);
    tcase_add_test(e2e, stage2_cpu_gil_wait_is_per_thread);
    tcase_add_test(e2e, stage2_cpu_64_devices_run);
    tcase_add_test(e2e, stage2_bad_flags_are_refused_clearly);
    tcase_add_test(e2e, stage2_help_batch_size_names_the_dataloader_batch);
    tcase_add_test(e2e, stage2_switch_interval_without_python_is_refused);
    tcase_add_test(e2e, stage2_bench_no_python_row_takes_the_calibrated_flags);
    tcase_add_test(e2e, stage2_set_smaller_than_the_devices_names_gpus);
    tcase_add_test(e2e, stage2_phase_notes_describe_what_was_measured);
    tcase_add_test(e2e, stage2_short_run_still_reports_the_gil);
    tcase_add_test(e2e, stage2_adam_state_is_on_device0_only);
    tcase_add_test(e2e, stage2_cuda_runs_and_phases_add_up);
    suite_add_tcase(s, e2e);
    return s;
}
