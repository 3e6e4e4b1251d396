/* test_clip.c — --clip-grad-norm (clip.h): the arithmetic against its closed form and against
 * torch.nn.utils.clip_grad_norm_ (tests/fixtures/clip.bin, made by tests/torch/clip_fixture.py), the
 * CUDA kernels against the CPU reference, and each stage end to end: a clipped SGD step has exactly
 * the length max_norm · lr; a threshold never reached changes no bit; DataParallel, DDP and
 * accumulation clip the reduced (accumulated) gradient, so they stay equal to one device clipping
 * the whole batch's; and stage 5 clips the unscaled gradients, not S times them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clip.h"
#include "model.h"
#include "ops.h"
#include "ops_ref.h"
#include "tests.h"

#define LIMIT "timeout -k 5 300 "
#define TINY "--device cpu --model tiny --deterministic --progress off --log-every 1 --workers 1"

static Device cpu_device(void) {
    Device d = {0};
    device_init(&d, DEV_CPU, 0, -1);
    return d;
}

/* ---- the arithmetic ------------------------------------------------------------------------------ */

/* ‖(3, 4)‖ = 5 exactly; torch's coefficient is (1/(5 + 1e-6)) · max_norm in fp32. */
START_TEST(clip_closed_form) {
    float norm, coef;
    int64_t clipped = 0;
    const float g[2] = {3.0f, 4.0f};
    ref_clip_norm_coef(2, g, 1.0f, &norm, &coef, &clipped);
    ck_assert(norm == 5.0f);
    ck_assert(coef == (1.0f / (5.0f + 1e-6f)) * 1.0f && clipped == 1);
    ref_clip_norm_coef(2, g, 10.0f, &norm, &coef, &clipped); /* below: the clamp, not counted */
    ck_assert(coef == 1.0f && clipped == 1);
    ref_clip_norm_coef(2, g, 5.0f, &norm, &coef, &clipped); /* at the threshold the 1e-6 still clips */
    ck_assert(coef < 1.0f && coef > 0.999999f && clipped == 2);
    /* torch's reciprocal-then-multiply, not a division: here the two differ in the last bit */
    const float m = 0.18219997f;
    volatile float den = 5.0f + 1e-6f;
    ref_clip_norm_coef(2, g, m, &norm, &coef, &clipped);
    ck_assert(coef == (1.0f / den) * m && coef != m / den && clipped == 3);
    const float z[3] = {0, 0, 0};
    ref_clip_norm_coef(3, z, 1.0f, &norm, &coef, &clipped);
    ck_assert(norm == 0.0f && coef == 1.0f && clipped == 3);
    const float inf[3] = {1, INFINITY, 2}, nan[3] = {1, NAN, 2};
    ref_clip_norm_coef(3, inf, 1.0f, &norm, &coef, &clipped); /* a step the GradScaler skips */
    ck_assert(isinf(norm) && coef == 0.0f && clipped == 3);
    ref_clip_norm_coef(3, nan, 1.0f, &norm, &coef, &clipped); /* clamp(NaN, max=1) is NaN, as in torch */
    ck_assert(isnan(norm) && isnan(coef) && clipped == 3);
    /* finite gradients whose squares pass FLT_MAX: torch's fp32 sum is inf, so ours is too (a double
     * sum would give 2e19 and clip to max_norm, where torch zeroes every gradient) */
    const float big[2] = {2e19f, 1.0f}, fits[2] = {1e19f, 1.0f};
    ref_clip_norm_coef(2, big, 1.0f, &norm, &coef, &clipped);
    ck_assert(isinf(norm) && coef == 0.0f && clipped == 3);
    ref_clip_norm_coef(2, fits, 1.0f, &norm, &coef, &clipped);
    ck_assert(norm == 1e19f && coef > 0.0f && clipped == 4);

    /* GradClip on the CPU backend: clips in place, reports the norm before, counts, and does
     * nothing at all when off */
    Device d = cpu_device();
    float x[2] = {3.0f, 4.0f};
    GradClip c;
    clip_init(&c, &d, 2, 0.5);
    clip_grad_norm(&c, x);
    ck_assert(clip_last_norm(&c) == 5.0f && clip_clipped_steps(&c) == 1 && c.steps == 1);
    const float k = (1.0f / (5.0f + 1e-6f)) * 0.5f;
    ck_assert(x[0] == 3.0f * k && x[1] == 4.0f * k);
    clip_grad_norm(&c, x); /* now at 0.5 (less 1e-7): clipped again by the 1e-6, barely */
    ck_assert(fabsf(clip_last_norm(&c) - 0.5f) < 1e-6f && c.steps == 2);
    clip_destroy(&c);
    clip_init(&c, &d, 2, 0);
    ck_assert(c.state == NULL);
    x[0] = 3.0f, x[1] = 4.0f;
    clip_grad_norm(&c, x);
    ck_assert(x[0] == 3.0f && x[1] == 4.0f && c.steps == 0);
    clip_destroy(&c);
    device_destroy(&d);
}
END_TEST

/* |a − b| within `ulps` units in the last place of b (both NaN, or both the same inf, pass). */
static int close_ulps(float a, float b, int ulps) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    float lo = b, hi = b;
    for (int i = 0; i < ulps; i++) lo = nextafterf(lo, -INFINITY), hi = nextafterf(hi, INFINITY);
    return a >= lo && a <= hi;
}

/* Every case of the torch fixture on device d: the norm clip_grad_norm_ returned and every clipped
 * value. Ours sums the squares in double, torch per tensor in fp32 and then the norms: the norm may
 * differ by a few ulps, and the coefficient with it. And the summary's clipped-steps count, which
 * torch has no twin of: a step counts when its gradient was scaled down — the 1e-6 of "eps" too —
 * but not an inf norm's, a step the GradScaler skips (the CUDA kernel counted it until checked). */
static void check_torch_cases(Device *d, const char *where) {
    Fx fx = fx_open("clip.bin", "tests/torch/clip_fixture.py");
    const char *cases[] = {"clipped", "below", "eps", "zero", "inf", "large", "huge"};
    const int64_t counted[] = {1, 0, 1, 0, 0, 1, 0};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char name[64];
        int64_t n, one;
        int dt;
        snprintf(name, sizeof name, "%s.grads", cases[k]);
        const float *g = fx_get(&fx, name, &n, &dt);
        snprintf(name, sizeof name, "%s.max_norm", cases[k]);
        const double max_norm = *(const double *)fx_get(&fx, name, &one, &dt);
        snprintf(name, sizeof name, "%s.norm", cases[k]);
        const float want_norm = *(const float *)fx_get(&fx, name, &one, &dt);
        snprintf(name, sizeof name, "%s.out", cases[k]);
        const float *want = fx_get(&fx, name, &one, &dt);
        ck_assert_int_eq(one, n);
        float *buf = device_alloc(d, (size_t)n * sizeof(float), "test grads"), *got = malloc((size_t)n * sizeof(float));
        device_copy_h2d(d, buf, g, (size_t)n * sizeof(float));
        GradClip c;
        clip_init(&c, d, n, max_norm);
        clip_grad_norm(&c, buf);
        const float norm = clip_last_norm(&c);
        device_copy_d2h(d, got, buf, (size_t)n * sizeof(float));
        ck_assert_msg(close_ulps(norm, want_norm, 4), "%s, case %s: norm %.9g, torch %.9g", where, cases[k],
                      (double)norm, (double)want_norm);
        int64_t bad = 0;
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(want[i]) || isnan(got[i])) {
                bad += isnan(want[i]) != isnan(got[i]);
                continue;
            }
            double e = fabs((double)got[i] - want[i]) / (fabs((double)want[i]) + 1e-30);
            if (want[i] == 0.0f) e = got[i] == 0.0f ? 0 : 1;
            worst = test_max_nan(worst, e);
        }
        ck_assert_msg(bad == 0, "%s, case %s: %lld values NaN on one side only", where, cases[k], (long long)bad);
        /* a coefficient a few ulps off moves every value by that much; the clamp makes "below" exact */
        ck_assert_msg(worst <= (strcmp(cases[k], "below") ? 1e-6 : 0), "%s, case %s: clipped values %.3g (relative) "
                      "from torch's", where, cases[k], worst);
        ck_assert_msg(clip_clipped_steps(&c) == counted[k], "%s, case %s: %lld clipped steps counted, not %lld", where,
                      cases[k], (long long)clip_clipped_steps(&c), (long long)counted[k]);
        clip_destroy(&c);
        device_free(d, buf);
        free(got);
    }
}

START_TEST(clip_matches_torch) {
    Device d = cpu_device();
    check_torch_cases(&d, "CPU");
    device_destroy(&d);
    if (!test_have_gpu("clip: the CUDA kernels against torch's clip_grad_norm_")) return;
    Device g = {0};
    device_init(&g, DEV_CUDA, 0, 0);
    check_torch_cases(&g, "CUDA");
    device_destroy(&g);
}
END_TEST

/* The kernels against the CPU reference on sizes from one value to ResNet-18's 11.2 M: the norm is a
 * double sum in another order, so it may round to a neighbouring float; it is the same bits on every
 * run (a fixed order, no atomics). */
START_TEST(clip_cuda_matches_reference) {
    if (!test_have_gpu("clip: the CUDA norm and coefficient against the CPU reference")) return;
    Device d = {0};
    device_init(&d, DEV_CUDA, 0, 0);
    const int64_t sizes[] = {1, 255, 4099, (1 << 20) + 3, 11173962};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        const int64_t n = sizes[k];
        float *h = malloc((size_t)n * sizeof(float)), *back = malloc((size_t)n * sizeof(float));
        test_fill_uniform(h, n, 100 + k, -0.01f, 0.01f);
        h[n / 2] = 3.0f; /* one large value, as a gradient spike */
        float *g = device_alloc(&d, (size_t)n * sizeof(float), "test grads");
        double *partials = device_alloc(&d, CLIP_PARTS * sizeof(double), "test partials");
        float *out = device_alloc(&d, 2 * sizeof(float), "test norm, coef");
        int64_t *cnt = device_alloc(&d, sizeof(int64_t), "test clipped");
        device_copy_h2d(&d, g, h, (size_t)n * sizeof(float));
        float rnorm, rcoef, got[2], again[2];
        int64_t rclipped = 0, dclipped;
        for (int rep = 0; rep < 2; rep++) {
            device_memset0(&d, cnt, sizeof(int64_t));
            clip_norm_coef(&d, n, g, partials, 1.0f, out, out + 1, cnt);
            device_copy_d2h(&d, rep ? again : got, out, sizeof got);
        }
        device_copy_d2h(&d, &dclipped, cnt, sizeof dclipped);
        ref_clip_norm_coef(n, h, 1.0f, &rnorm, &rcoef, &rclipped);
        ck_assert_msg(close_ulps(got[0], rnorm, 1), "n = %lld: norm %.9g, reference %.9g", (long long)n, (double)got[0],
                      (double)rnorm);
        ck_assert_msg(close_ulps(got[1], rcoef, 2), "n = %lld: coef %.9g, reference %.9g", (long long)n, (double)got[1],
                      (double)rcoef);
        ck_assert(memcmp(got, again, sizeof got) == 0); /* the same bits every run */
        ck_assert(dclipped == rclipped && rclipped == 1);
        /* and the multiply: every value times the coefficient, exactly (one IEEE product) */
        scale_by_device(&d, n, g, out + 1);
        device_copy_d2h(&d, back, g, (size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) ck_assert(back[i] == h[i] * got[1]);
        if (n > 1) { /* a buffer that is not 16-byte aligned takes the kernels' scalar paths */
            device_copy_h2d(&d, g, h, (size_t)n * sizeof(float));
            rclipped = 0;
            ref_clip_norm_coef(n - 1, h + 1, 0.5f, &rnorm, &rcoef, &rclipped);
            clip_norm_coef(&d, n - 1, g + 1, partials, 0.5f, out, out + 1, cnt);
            device_copy_d2h(&d, got, out, sizeof got);
            ck_assert_msg(close_ulps(got[0], rnorm, 1) && close_ulps(got[1], rcoef, 2), "n = %lld, unaligned: norm %.9g "
                          "coef %.9g, reference %.9g %.9g", (long long)n - 1, (double)got[0], (double)got[1],
                          (double)rnorm, (double)rcoef);
            scale_by_device(&d, n - 1, g + 1, out + 1);
            device_copy_d2h(&d, back, g, (size_t)n * sizeof(float));
            ck_assert(back[0] == h[0]);
            for (int64_t i = 1; i < n; i++) ck_assert(back[i] == h[i] * got[1]);
        }
        device_free(&d, g), device_free(&d, partials), device_free(&d, out), device_free(&d, cnt);
        free(h), free(back);
    }
    device_destroy(&d);
}
END_TEST

/* ---- stage 1: what clipping does to a step ------------------------------------------------------- */


static float *initial_params(int64_t *n) {
    Device d = cpu_device();
    Model *m = model_create(&d, "tiny", 1, 1, 0); /* --seed 0's weights, as stage 1 creates them */
    *n = m->n_param_floats;
    float *p = malloc((size_t)*n * sizeof(float));
    memcpy(p, m->param_flat, (size_t)*n * sizeof(float));
    model_destroy(m);
    device_destroy(&d);
    return p;
}

/* Plain SGD (no momentum, no weight decay, constant lr) moves the parameters by lr · g: clipped to
 * max_norm, the first step's length is lr · max_norm · norm / (norm + 1e-6) — whatever the gradient
 * was. A threshold never reached changes no bit of a 3-step run with momentum. */
START_TEST(stage1_a_clipped_step_has_length_lr_times_max_norm) {
    char *dir = test_tmpdir(), cmd[2048], path[600];
    const double lr = 0.1, max_norm = 0.05;
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 " TINY " --train-size 256 --test-size 32 --steps 1 --lr %g "
             "--momentum 0 --weight-decay 0 --schedule const --clip-grad-norm %g --save %s/a --report %s/a.jsonl",
             test_root(), lr, max_norm, dir, dir);
    test_run_ok(cmd, "stage 1 clipped", NULL);
    snprintf(path, sizeof path, "%s/a.jsonl", dir);
    const double norm = test_report_field(path, "step", "grad_norm");
    ck_assert_msg(norm > 10 * max_norm, "the first step's gradient norm %.6g is not far above %g", norm, max_norm);
    ck_assert(test_report_field(path, "summary", "clipped_steps") == 1);
    ck_assert(test_report_field(path, "summary", "clip_steps") == 1);
    ck_assert(test_report_field(path, "summary", "clip_grad_norm") == max_norm);
    int64_t n;
    float *p0 = initial_params(&n);
    snprintf(path, sizeof path, "%s/a/step%08d.ckpt", dir, 1);
    float *p1 = test_load_params(path, "tiny", 1);
    double len = 0;
    for (int64_t i = 0; i < n; i++) len += ((double)p1[i] - p0[i]) * ((double)p1[i] - p0[i]);
    len = sqrt(len);
    const double want = lr * max_norm * norm / (norm + 1e-6);
    ck_assert_msg(fabs(len - want) <= 1e-4 * want, "the clipped step moved the parameters by %.8g, not lr · max_norm "
                  "= %.8g", len, want);
    free(p0), free(p1);

    /* never reached: the same bits as no clipping, and nothing counted */
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 " TINY " --train-size 256 --test-size 32 --steps 3 --save %s/off",
             test_root(), dir);
    test_run_ok(cmd, "stage 1 unclipped", NULL);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 " TINY " --train-size 256 --test-size 32 --steps 3 --clip-grad-norm 1e30 "
             "--save %s/huge --report %s/huge.jsonl", test_root(), dir, dir);
    test_run_ok(cmd, "stage 1 with an unreachable threshold", NULL);
    snprintf(path, sizeof path, "%s/off/step%08d.ckpt", dir, 3);
    float *off = test_load_params(path, "tiny", 1);
    snprintf(path, sizeof path, "%s/huge/step%08d.ckpt", dir, 3);
    float *huge = test_load_params(path, "tiny", 1);
    ck_assert_msg(memcmp(off, huge, (size_t)n * sizeof(float)) == 0, "a threshold never reached changed the parameters");
    snprintf(path, sizeof path, "%s/huge.jsonl", dir);
    double norms[8];
    ck_assert_int_eq(test_report_series(path, "step", "grad_norm", norms, 8), 3);
    for (int i = 0; i < 3; i++) ck_assert(norms[i] > 0 && isfinite(norms[i]));
    ck_assert(test_report_field(path, "summary", "clipped_steps") == 0);
    free(off), free(huge), free(dir);
}
END_TEST

/* ---- where each parallel stage clips --------------------------------------------------------------- */

static void read_params_losses(const char *dir, const char *name, int steps, float **p, double *loss) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s.jsonl", dir, name);
    ck_assert_int_eq(test_read_losses(path, loss, 16), steps);
    ck_assert_msg(test_report_field(path, "summary", "clipped_steps") == steps, "%s: not every step was clipped", name);
    snprintf(path, sizeof path, "%s/%s/step%08d.ckpt", dir, name, steps);
    *p = test_load_params(path, "tiny", 0);
}

/* One device clipping the whole batch's gradient, against DataParallel (2 replicas, the gradient
 * reduced onto the first), DDP (2 ranks, after the all-reduce) and DDP with accumulation (2 ranks ×
 * 2 micro-batches, once per optimizer step): the same losses and parameters. Clipping each rank's
 * own gradient, or each micro-batch's, would give others. No batch norm, whose statistics are per
 * replica. */
START_TEST(parallel_stages_clip_the_reduced_gradient) {
    char *dir = test_tmpdir(), cmd[2048], common[512];
    const int steps = 4;
    snprintf(common, sizeof common, TINY " --norm none --train-size 256 --test-size 32 --steps %d --lr 0.05 "
             "--clip-grad-norm 0.02", steps);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 %s --batch-size 32 --save %s/one --report %s/one.jsonl", test_root(),
             common, dir, dir);
    test_run_ok(cmd, "stage 1", NULL);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage2 %s --gpus 2 --batch-size 16 --save %s/dp --report %s/dp.jsonl",
             test_root(), common, dir, dir);
    test_run_ok(cmd, "stage 2", NULL);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 %s --nproc-per-node 2 --batch-size 16 --master-port %d --save %s/ddp "
             "--report %s/ddp.jsonl", test_root(), common, test_free_port(), dir, dir);
    test_run_ok(cmd, "stage 3", NULL);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage4 %s --nproc-per-node 2 --batch-size 8 --accum-steps 2 --master-port %d "
             "--save %s/acc --report %s/acc.jsonl", test_root(), common, test_free_port(), dir, dir);
    test_run_ok(cmd, "stage 4", NULL);
    float *one, *other;
    double lone[16], l[16];
    read_params_losses(dir, "one", steps, &one, lone);
    const char *names[] = {"dp", "ddp", "acc"};
    for (int k = 0; k < 3; k++) {
        read_params_losses(dir, names[k], steps, &other, l);
        for (int i = 0; i < steps; i++)
            ck_assert_msg(fabs(l[i] - lone[i]) <= 1e-5 * fabs(lone[i]), "%s: step %d loss %.9g, one device %.9g",
                          names[k], i + 1, l[i], lone[i]);
        double err = test_rel_err(other, one, test_n_params("tiny"));
        ck_assert_msg(err <= 1e-5, "%s: parameters %.3g (relative) from one device's", names[k], err);
        free(other);
    }
    free(one), free(dir);
}
END_TEST

/* ---- stage 5: unscale first ---------------------------------------------------------------------- */

/* ||p − p0|| after a run saved in dir/name (tiny, --norm bn, seed 0). */
static double moved(const char *dir, const char *name, int steps) {
    char path[700];
    int64_t n;
    float *p0 = initial_params(&n);
    snprintf(path, sizeof path, "%s/%s/step%08d.ckpt", dir, name, steps);
    float *p = test_load_params(path, "tiny", 1);
    double len = 0;
    for (int64_t i = 0; i < n; i++) len += ((double)p[i] - p0[i]) * ((double)p[i] - p0[i]);
    free(p0), free(p);
    return sqrt(len);
}

/* Under fp16 the gradients carry the GradScaler's 65536: clipping must read them unscaled, and the
 * step must not unscale them again. The norm stage 5 reports under fp16 and bf16 is the fp32 run's
 * (to 16-bit rounding), not 65536 times it, and the parameters move as far as fp32's do. A step with
 * an inf gradient reports no norm (JSON null), is not counted as clipped, and is skipped; the
 * gradient statistics count what backward produced, the same with clipping as without. */
START_TEST(amp_clips_the_unscaled_gradients) {
    char *dir = test_tmpdir(), cmd[2048], path[600];
    const char *amps[] = {"off", "fp16", "bf16"};
    double first[3], dist[3];
    for (int k = 0; k < 3; k++) {
        snprintf(cmd, sizeof cmd, LIMIT "%s/stage5 " TINY " --nproc-per-node 1 --train-size 256 --test-size 32 "
                 "--steps 3 --amp %s --clip-grad-norm 0.1 --master-port %d --save %s/%s --report %s/%s.jsonl",
                 test_root(), amps[k], test_free_port(), dir, amps[k], dir, amps[k]);
        test_run_ok(cmd, amps[k], NULL);
        snprintf(path, sizeof path, "%s/%s.jsonl", dir, amps[k]);
        double norms[8];
        ck_assert_int_eq(test_report_series(path, "step", "grad_norm", norms, 8), 3);
        ck_assert(test_report_field(path, "summary", "clipped_steps") == 3);
        first[k] = norms[0];
        dist[k] = moved(dir, amps[k], 3);
    }
    for (int k = 1; k < 3; k++) {
        ck_assert_msg(fabs(first[k] - first[0]) <= 0.02 * first[0], "--amp %s: the first step's norm %.6g, fp32's %.6g "
                      "(a scaled gradient's norm is 65536 times larger)", amps[k], first[k], first[0]);
        ck_assert_msg(fabs(dist[k] - dist[0]) <= 0.02 * dist[0], "--amp %s: 3 clipped steps moved the parameters by "
                      "%.6g, fp32's by %.6g", amps[k], dist[k], dist[0]);
    }
    /* a forced overflow at step 2, with and without clipping */
    double counts[2][8];
    for (int clip = 0; clip < 2; clip++) {
        snprintf(cmd, sizeof cmd, LIMIT "%s/stage5 " TINY " --nproc-per-node 1 --train-size 256 --test-size 32 "
                 "--steps 3 --amp fp16 --grad-stats --test-inf-step 2%s --master-port %d --report %s/inf%d.jsonl",
                 test_root(), clip ? " --clip-grad-norm 0.1" : "", test_free_port(), dir, clip);
        test_run_ok(cmd, "fp16 with an inf step", NULL);
        snprintf(path, sizeof path, "%s/inf%d.jsonl", dir, clip);
        ck_assert(test_report_field(path, "amp", "skipped_steps") == 1);
        ck_assert_int_eq(test_report_list(path, "amp", "grad_nonfinite_per_step", counts[clip], 8), 3);
        if (clip) {
            double norms[8];
            ck_assert_int_eq(test_report_series(path, "step", "grad_norm", norms, 8), 3);
            ck_assert_msg(isnan(norms[1]), "the inf step's norm is %g, not null", norms[1]);
            ck_assert(test_report_field(path, "summary", "clipped_steps") == 2);
        }
    }
    int64_t n_params;
    free(initial_params(&n_params)); /* with batch norm's */
    ck_assert_msg(counts[0][1] > 0 && counts[0][1] < n_params, "the inf step: %g of %lld gradients non-finite",
                  counts[0][1], (long long)n_params);
    for (int s = 0; s < 3; s++)
        ck_assert_msg(counts[1][s] == counts[0][s], "--grad-stats at step %d: %g non-finite with clipping, %g without "
                      "(it must count before clipping)", s + 1, counts[1][s], counts[0][s]);
    free(dir);
}
END_TEST

/* ---- refusals ------------------------------------------------------------------------------------ */

START_TEST(clip_bad_flags_refused) {
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 --device cpu --clip-grad-norm -1", test_root());
    ck_assert(test_run(cmd, &out) != 0);
    ck_assert_msg(strstr(out, "--clip-grad-norm"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 --device cpu --clip-grad-norm 1 --optimizer-overlap after-backward",
             test_root());
    ck_assert(test_run(cmd, &out) != 0);
    ck_assert_msg(strstr(out, "--clip-grad-norm") && strstr(out, "--optimizer-overlap") && !strstr(out, "ASSERT"), "%s",
                  out);
    free(out);
    char *dir = test_tmpdir();
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 " TINY " --train-size 64 --test-size 32 --steps 1 --save %s", test_root(),
             dir);
    test_run_ok(cmd, "a checkpoint to evaluate", NULL);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 --device cpu --clip-grad-norm 1 --evaluate --resume %s/epoch001.ckpt",
             test_root(), dir);
    ck_assert(test_run(cmd, &out) != 0);
    ck_assert_msg(strstr(out, "--clip-grad-norm applies only to training"), "%s", out);
    free(out), free(dir);
}
END_TEST

Suite *suite_clip(void) {
    Suite *s = suite_create("clip");
    TCase *tc = tcase_create("clip");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, clip_closed_form);
    tcase_add_test(tc, clip_matches_torch);
    tcase_add_test(tc, clip_cuda_matches_reference);
    tcase_add_test(tc, stage1_a_clipped_step_has_length_lr_times_max_norm);
    tcase_add_test(tc, parallel_stages_clip_the_reduced_gradient);
    tcase_add_test(tc, amp_clips_the_unscaled_gradients);
    tcase_add_test(tc, clip_bad_flags_refused);
    suite_add_tcase(s, tc);
    return s;
}
