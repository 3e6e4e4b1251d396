/* test_adam.c — --optimizer adam (common/adam.h) against torch.optim.Adam's own trajectory
 * (tests/fixtures/adam.bin, written by tests/torch/make_adam_fixture.py), and the CUDA update
 * against the CPU one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adam.h"
#include "optim.h"
#include "tests.h"

/* ---- the fixture (tests.h: fx_open, fx_need) -------------------------------------------------- */
enum { N = 1003, STEPS = 6 };

/* Run one fixture case through optim_step on a device; params after each step into out[STEPS][N]. */
static void run_case(const Fx *fx, const char *cas, DeviceKind kind, float *out) {
    const float *p0 = fx_need(fx, cas, "p0", 0, N), *grads = fx_need(fx, cas, "grads", 0, STEPS * N);
    const double *lrs = fx_need(fx, cas, "lrs", 1, STEPS), *wd = fx_need(fx, cas, "wd", 1, 1);
    Device d = {0};
    device_init(&d, kind, 0, kind == DEV_CUDA ? 0 : -1);
    float *p = device_alloc(&d, N * sizeof(float), "p"), *g = device_alloc(&d, N * sizeof(float), "g");
    device_copy_h2d(&d, p, p0, N * sizeof(float));
    Optimizer opt;
    optim_init_named(&opt, "adam", &d, N, lrs[0], 0.9, *wd);
    ck_assert(opt.adam && opt.momentum_buf == NULL);
    for (int s = 0; s < STEPS; s++) {
        device_copy_h2d(&d, g, grads + (size_t)s * N, N * sizeof(float));
        optim_step(&opt, p, g, lrs[s]);
        device_copy_d2h(&d, out + (size_t)s * N, p, N * sizeof(float));
    }
    ck_assert_int_eq(opt.steps, STEPS);
    optim_destroy(&opt);
    device_free(&d, p), device_free(&d, g);
    device_destroy(&d);
}

/* Largest |a − b| in units of b's float32 spacing (ulp), over n values (NaN if any value is NaN). */
static double max_ulps(const float *a, const float *b, int64_t n) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double ulp = nextafterf(fabsf(b[i]), INFINITY) - fabsf(b[i]);
        worst = test_max_nan(worst, fabs((double)a[i] - b[i]) / ulp);
    }
    return worst;
}

static Fx open_fixture(void) { return fx_open("adam.bin", "tests/torch/make_adam_fixture.py"); }

/* Our float32 CPU update follows torch's CPU kernels operation by operation (fused where theirs
 * fuse) and mostly agrees to the bit. What is left: torch's vectorised float sqrt is not always
 * correctly rounded (for v = 0x1.34b69cp-11 it returns 0x1.8d91b4p-6, IEEE sqrtf 0x1.8d91b2p-6),
 * and one ulp in the denominator becomes a few ulps of the parameter: 8 ulps after 6 steps bounds
 * it (we see ≤ 4). A semantic slip is far larger — AdamW's decoupled decay, no bias correction,
 * eps inside the square root or the lr of the wrong step each move parameters by 1e-5 … 1e-2,
 * thousands of ulps. */
START_TEST(adam_matches_torch_cpu) {
    Fx fx = open_fixture();
    const char *cases[2] = {"wd", "nowd"};
    float *ours = malloc(STEPS * N * sizeof(float));
    for (int c = 0; c < 2; c++) {
        const float *want = fx_need(&fx, cases[c], "params", 0, STEPS * N);
        run_case(&fx, cases[c], DEV_CPU, ours);
        for (int s = 0; s < STEPS; s++) {
            double u = max_ulps(ours + (size_t)s * N, want + (size_t)s * N, N);
            ck_assert_msg(u <= 8, "%s, step %d: %.1f ulps from torch.optim.Adam", cases[c], s + 1, u);
        }
        /* and the trajectory really moved: the fixture is not a no-op */
        const float *p0 = fx_need(&fx, cases[c], "p0", 0, N);
        ck_assert(max_ulps(want + (size_t)(STEPS - 1) * N, p0, N) > 1000);
    }
    free(ours);
}
END_TEST

/* The CUDA kernel rounds as the CPU reference does: the same bits. */
START_TEST(adam_cuda_matches_cpu) {
    if (!test_have_gpu("adam: CUDA update against the CPU reference")) return;
    Fx fx = open_fixture();
    float *cpu = malloc(STEPS * N * sizeof(float)), *gpu = malloc(STEPS * N * sizeof(float));
    for (int c = 0; c < 2; c++) {
        const char *cas = c ? "nowd" : "wd";
        run_case(&fx, cas, DEV_CPU, cpu);
        run_case(&fx, cas, DEV_CUDA, gpu);
        double u = max_ulps(gpu, cpu, STEPS * N);
        ck_assert_msg(u <= 1, "%s: CUDA is %.1f ulps from the CPU reference", cas, u);
    }
    free(cpu), free(gpu);
}
END_TEST

/* Under the GradScaler (optim_step_unless, a device flag): the fixture's 6 steps with two skipped
 * attempts between them — an inf gradient and the flag set — end bit-identical to the 6 plain steps
 * (a skipped attempt changes nothing: parameters, both moments, and the step count that sets the
 * bias corrections), and Adam counts 6 steps out of 8 attempts. Stage 5 with --optimizer adam used to
 * fall through to an SGD step here. */
static void run_case_unless(const Fx *fx, const char *cas, DeviceKind kind, const char *pattern, float *out,
                            float *every) {
    const float *p0 = fx_need(fx, cas, "p0", 0, N), *grads = fx_need(fx, cas, "grads", 0, STEPS * N);
    const double *lrs = fx_need(fx, cas, "lrs", 1, STEPS), *wd = fx_need(fx, cas, "wd", 1, 1);
    Device d = {0};
    device_init(&d, kind, 0, kind == DEV_CUDA ? 0 : -1);
    float *p = device_alloc(&d, N * sizeof(float), "p"), *g = device_alloc(&d, N * sizeof(float), "g");
    float *flag = device_alloc(&d, sizeof(float), "found_inf"), *before = malloc(3 * N * sizeof(float));
    float *after = malloc(3 * N * sizeof(float)), *bad = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) bad[i] = i % 3 ? INFINITY : NAN;
    device_copy_h2d(&d, p, p0, N * sizeof(float));
    Optimizer opt;
    optim_init_named(&opt, "adam", &d, N, lrs[0], 0.9, *wd);
    int taken = 0;
    for (const char *c = pattern; *c; c++) {
        float skip = *c == 'I';
        device_copy_h2d(&d, flag, &skip, sizeof skip);
        device_copy_h2d(&d, g, skip ? bad : grads + (size_t)taken * N, N * sizeof(float));
        float *state[3] = {p, opt.adam->exp_avg, opt.adam->exp_avg_sq};
        for (int k = 0; k < 3; k++) device_copy_d2h(&d, before + k * N, state[k], N * sizeof(float));
        optim_step_unless(&opt, p, g, skip ? 123.0 : lrs[taken], flag);
        for (int k = 0; k < 3; k++) device_copy_d2h(&d, after + k * N, state[k], N * sizeof(float));
        if (skip) ck_assert_msg(!memcmp(before, after, 3 * N * sizeof(float)), "a skipped step wrote");
        else device_copy_d2h(&d, out + (size_t)taken++ * N, p, N * sizeof(float));
        if (every) device_copy_d2h(&d, every + (size_t)(c - pattern) * N, p, N * sizeof(float));
    }
    ck_assert_int_eq(taken, STEPS);
    ck_assert_int_eq(optim_adam_steps(&opt), STEPS);
    ck_assert_int_eq(opt.steps, (int64_t)strlen(pattern));
    optim_destroy(&opt);
    device_free(&d, p), device_free(&d, g), device_free(&d, flag);
    free(before), free(after), free(bad);
    device_destroy(&d);
}

START_TEST(adam_under_the_scaler_skips_exactly) {
    Fx fx = open_fixture();
    float *plain = malloc(STEPS * N * sizeof(float)), *unless = malloc(STEPS * N * sizeof(float));
    int gpu = test_have_gpu("adam: the GradScaler's skipping update on CUDA against the CPU one");
    for (int c = 0; c < 2; c++) {
        const char *cas = c ? "nowd" : "wd";
        run_case(&fx, cas, DEV_CPU, plain);
        run_case_unless(&fx, cas, DEV_CPU, "FIFFIIFFF", unless, NULL);
        ck_assert_msg(!memcmp(plain, unless, STEPS * N * sizeof(float)), "%s: skips changed the trajectory", cas);
        if (gpu) {
            run_case_unless(&fx, cas, DEV_CUDA, "IFFIFFFF", unless, NULL);
            double u = max_ulps(unless, plain, STEPS * N);
            ck_assert_msg(u <= 1, "%s: CUDA (device step count) is %.1f ulps from the CPU reference", cas, u);
        }
    }
    free(plain), free(unless);
}
END_TEST

/* The outside oracle for the skipping: torch.optim.Adam(fused=True) stepped by torch.amp.GradScaler
 * along the same kind of pattern on a GPU (tests/torch/adam_scaler_fixture.py). Fused Adam rounds its
 * own way, and a few parameters pass near 0 (where one rounding is many ulps of the value), so the
 * measure is the largest difference relative to the largest parameter: within 1e-6 after every
 * attempt (an H200 gave at most 1.8e-7, about 1.5 ulps of the largest). Had a skipped attempt
 * advanced Adam's step count, every later step would use the next step's bias corrections —
 * 1 − 0.9^t off by a quarter at t = 3 — and move the parameters by ~1e-4 of their size. */
START_TEST(adam_under_the_scaler_matches_torch_fused) {
    Fx fx = fx_open("adam_scaler.bin", "tests/torch/adam_scaler_fixture.py");
    for (int c = 0; c < 2; c++) {
        const char *cas = c ? "nowd" : "wd";
        char k[64];
        snprintf(k, sizeof k, "%s.pattern", cas);
        int64_t attempts;
        int dt;
        const double *pat = fx_get(&fx, k, &attempts, &dt);
        ck_assert(dt == 1 && attempts > STEPS && attempts < 32);
        char pattern[32];
        for (int64_t i = 0; i < attempts; i++) pattern[i] = pat[i] != 0 ? 'I' : 'F';
        pattern[attempts] = 0;
        const float *want = fx_need(&fx, cas, "params", 0, attempts * N);
        float *taken = malloc(STEPS * N * sizeof(float)), *every = malloc((size_t)attempts * N * sizeof(float));
        run_case_unless(&fx, cas, DEV_CPU, pattern, taken, every);
        double worst = 0;
        for (int64_t a = 0; a < attempts; a++) {
            double e = test_rel_err(every + a * N, want + a * N, N);
            ck_assert_msg(e <= 1e-6, "%s, attempt %lld (%c): %.3g from torch's fused Adam under GradScaler (relative "
                          "to the largest parameter)", cas, (long long)a + 1, pattern[a], e);
            if (e > worst) worst = e;
        }
        printf("adam under the scaler, %s (%s): within %.2g of torch's fused Adam\n", cas, pattern, worst);
        free(taken), free(every);
    }
}
END_TEST

/* torch computes denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) on float32 tensors:
 * the quotient is rounded to float32 and eps added in float32. Adding eps before that rounding (in
 * double) is off by an ulp of the denominator now and then — under the 8 ulps the fixture allows for
 * torch's sqrt, and where √v̂ is far above eps (the fixture's values) it never shows. Here √v̂ sits
 * around eps (|g| from eps/4 to 4·eps, step 1, p = 0 so the update is the whole parameter), and the
 * result must be the float32 sum's to the bit — and the data can tell the two roundings apart. */
START_TEST(adam_adds_eps_to_the_float32_denominator) {
    enum { K = 4096 };
    static float p[K], g[K], m[K], v[K];
    for (int i = 0; i < K; i++) p[i] = m[i] = v[i] = 0.f, g[i] = (i % 2 ? -1e-8f : 1e-8f) * exp2f(-2.f + 4.f * i / K);
    Device d = {0};
    device_init(&d, DEV_CPU, 0, -1);
    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    adam_step(&d, K, p, g, m, v, lr, b1, b2, eps, 0.0, 1);
    const float neg_step = (float)-(lr / (1.0 - b1)), w1 = (float)(1.0 - b1), w2 = (float)(1.0 - b2);
    const double inv = 1.0 / (double)(float)sqrt(1.0 - b2);
    int apart = 0;
    for (int i = 0; i < K; i++) {
        const float mi = fmaf(w1, g[i], 0.f), vi = fmaf(w2 * g[i], g[i], 0.f);
        const double q = (double)sqrtf(vi) * inv;
        const float want = neg_step * mi / ((float)q + (float)eps), other = neg_step * mi / (float)(q + (float)eps);
        ck_assert_msg(p[i] == want, "element %d (g %a): %a, torch's float32 denominator gives %a", i, g[i], p[i], want);
        apart += other != want;
    }
    ck_assert_msg(apart > 0, "the test cannot tell where eps is added");
    device_destroy(&d);
}
END_TEST

Suite *suite_adam(void) {
    Suite *s = suite_create("adam");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, adam_matches_torch_cpu);
    tcase_add_test(tc, adam_adds_eps_to_the_float32_denominator);
    tcase_add_test(tc, adam_cuda_matches_cpu);
    tcase_add_test(tc, adam_under_the_scaler_skips_exactly);
    tcase_add_test(tc, adam_under_the_scaler_matches_torch_fused);
    suite_add_tcase(s, tc);
    return s;
}
