/* test_ops_cuda.c — every CUDA op (ops_cuda.c, kernels.cu) against the CPU reference (ops_ref.c)
 * on the same random inputs, plus the properties only the GPU backend has: the per-batch-size conv
 * plan cache, deterministic algorithms, benchmark search, and memory accounting.
 *
 * Without a visible GPU every test prints a SKIP line and passes, so the suite runs anywhere.
 * Each test opens its own Device with allow_tf32 = 0 (true fp32, CUDNN_FMA_MATH): with TF32 the
 * GPU would legitimately differ from the reference by ~1e-3 and the comparison would prove little.
 *
 * Tolerances (relative: ‖got − want‖∞ / ‖want‖∞, see test_rel_err):
 *  - TOL_CONV 1e-4: cuDNN sums in fp32 but in its own order and, depending on the algorithm chosen,
 *    through Winograd or FFT transforms whose fp32 rounding adds error of order 1e-6–1e-5 relative
 *    to the output's scale. Our reductions are at most ~10^4 terms (≈ 1e-6 in a random-walk
 *    order), so a correct op scores ≤ 1e-5; any real bug (wrong index, padding, transpose) is O(1).
 *  - TOL_SUM 1e-4: other reductions in fp32 on the GPU against the reference (batch norm sums in
 *    double, the GEMM in float with another blocking): same reasoning, no transforms.
 *  - TOL_ELEM 1e-5: one or two roundings per element (the GPU may fuse a multiply-add, or divide
 *    in float where the reference divides in double) — a few ulps at most.
 *  - pure elementwise ops (relu, add, copies, scaling) are the same single IEEE operation on both
 *    sides and must match exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "amp.h"
#include "device.h"
#include "model.h" /* conv_weight_oihw_to_krsc: the public order of a conv weight */
#include "ops.h"
#include "ops_ref.h"
#include "precision.h"
#include "tests.h"
#ifdef USE_CUDA
#include "kernels.h" /* launch_bn_*: the scratch-size contract, tested below */
#endif

#define TOL_CONV 1e-4
#define TOL_SUM 1e-4
#define TOL_ELEM 1e-5

#define BN_MOMENTUM 0.1f
#define BN_EPS 1e-5f

/* ---- host buffers ---------------------------------------------------------------------------- */

static float *hrand(int64_t n, uint64_t seed, float lo, float hi) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    test_fill_uniform(p, n, seed, lo, hi);
    return p;
}

static float *hcopy(const float *src, int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(p, src, (size_t)n * sizeof(float));
    return p;
}

static float *hzeros(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

/* ---- device buffers -------------------------------------------------------------------------- */

/* A CUDA device in true fp32; deterministic / benchmark as asked. */
static void gpu_open(Device *d, int deterministic, int benchmark) {
    memset(d, 0, sizeof *d);
    d->allow_tf32 = 0;
    d->deterministic = deterministic;
    d->benchmark = benchmark;
    device_init(d, DEV_CUDA, 0, 0);
}

static float *up(Device *d, const float *h, int64_t n) {
    float *p = device_alloc(d, (size_t)n * sizeof(float), "test tensor");
    device_copy_h2d(d, p, h, (size_t)n * sizeof(float));
    return p;
}

static float *dzeros(Device *d, int64_t n) {
    float *p = device_alloc(d, (size_t)n * sizeof(float), "test tensor");
    device_memset0(d, p, (size_t)n * sizeof(float));
    return p;
}

/* Synchronous copy back into a fresh host buffer (device_copy_d2h waits for the stream). */
static float *down(Device *d, const float *p, int64_t n) {
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    device_copy_d2h(d, h, p, (size_t)n * sizeof(float));
    return h;
}

/* ---- comparisons ----------------------------------------------------------------------------- */

/* OPS_CUDA_VERBOSE=1 prints every measured error, to see the margin against each tolerance. */
static int verbose(void) {
    const char *v = getenv("OPS_CUDA_VERBOSE");
    return v && v[0] && v[0] != '0';
}

#define EXPECT_CLOSE(got, want, n, tol, ...)                                                       \
    do {                                                                                           \
        double e_ = test_rel_err((got), (want), (n));                                              \
        char what_[160];                                                                           \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                                \
        if (verbose()) printf("  %-60s rel err %.2e (tol %.0e)\n", what_, e_, (double)(tol));      \
        ck_assert_msg(e_ <= (tol), "%s: relative error %.3g (tolerance %.1g)", what_, e_,          \
                      (double)(tol));                                                              \
    } while (0)

/* Download a device tensor and compare it with the reference. */
#define EXPECT_GPU_CLOSE(d, dev, want, n, tol, ...)                                                \
    do {                                                                                           \
        float *g_ = down((d), (dev), (n));                                                         \
        EXPECT_CLOSE(g_, (want), (n), (tol), __VA_ARGS__);                                         \
        free(g_);                                                                                  \
    } while (0)

#define EXPECT_GPU_EXACT(d, dev, want, n, what)                                                    \
    do {                                                                                           \
        float *g_ = down((d), (dev), (n));                                                         \
        int64_t bad_ = 0, first_ = -1;                                                             \
        for (int64_t i_ = 0; i_ < (n); i_++)                                                       \
            if (!(g_[i_] == (want)[i_] || (isnan(g_[i_]) && isnan((want)[i_])))) { /* any NaN ≡ NaN */ \
                if (first_ < 0) first_ = i_;                                                       \
                bad_++;                                                                            \
            }                                                                                      \
        ck_assert_msg(bad_ == 0, "%s: %lld of %lld elements differ (first at %lld: %g vs %g)",     \
                      (what), (long long)bad_, (long long)(n), (long long)first_,                  \
                      first_ >= 0 ? (double)g_[first_] : 0.0,                                      \
                      first_ >= 0 ? (double)(want)[first_] : 0.0);                                 \
        free(g_);                                                                                  \
    } while (0)

/* ---- convolution ----------------------------------------------------------------------------- */

typedef struct {
    int cin, cout, k, stride, pad, h, w;
} ConvCfg;

/* ResNet-18's kinds of convolution. h ≠ w everywhere but the stem, so a swapped height/width
 * cannot go unnoticed; cin ≠ cout, so a transposed filter cannot either. */
static const ConvCfg conv_cfgs[] = {
    {16, 32, 3, 1, 1, 12, 10}, /* k3 s1 p1: the body of a basic block */
    {16, 32, 3, 2, 1, 12, 10}, /* k3 s2 p1: the first conv of a downsampling block */
    {16, 32, 1, 2, 0, 12, 10}, /* k1 s2 p0: the projection shortcut */
    {3, 16, 3, 1, 1, 32, 32},  /* the CIFAR stem: cin = 3 is an unusual shape for cuDNN */
};

/* Run all three passes of conv c at batch n on fresh inputs and compare with the reference:
 * forward; backward-data overwriting (into garbage) and accumulating; backward-filter accumulating
 * onto a non-zero dw. When the batch size was prepared, the ops must not allocate anything. */
static void check_conv(Device *d, Conv *c, int n, uint64_t seed, int prepared, const char *tag) {
    const ConvShape *s = &c->s;
    int64_t xn = (int64_t)n * s->cin * s->h * s->w, yn = (int64_t)n * s->cout * s->hout * s->wout;
    int64_t wn = (int64_t)s->cout * s->cin * s->k * s->k;
    float *hx = hrand(xn, seed, -1.f, 1.f), *hw = hrand(wn, seed + 1, -0.5f, 0.5f);
    float *hdy = hrand(yn, seed + 2, -1.f, 1.f), *hdx0 = hrand(xn, seed + 3, -1.f, 1.f);
    float *hdw0 = hrand(wn, seed + 4, -1.f, 1.f);

    float *ry = hzeros(yn), *rdx = hzeros(xn), *rdx_acc = hcopy(hdx0, xn), *rdw = hcopy(hdw0, wn);
    float *rdw_new = hzeros(wn);
    ref_conv_forward_f32(s, n, hx, hw, ry);
    ref_conv_backward_data_f32(s, n, hdy, hw, rdx, 0);
    ref_conv_backward_data_f32(s, n, hdy, hw, rdx_acc, 1);
    ref_conv_backward_filter_f32(s, n, hx, hdy, rdw, 1);
    ref_conv_backward_filter_f32(s, n, hx, hdy, rdw_new, 0);

    float *x = up(d, hx, xn), *w = up(d, hw, wn), *dy = up(d, hdy, yn), *y = dzeros(d, yn);
    float *dx = up(d, hdx0, xn), *dx_acc = up(d, hdx0, xn), *dw = up(d, hdw0, wn), *dw_new = up(d, hdw0, wn);
    size_t cur = d->mem_cur;
    int n_allocs = d->n_allocs;
    conv_forward(d, c, n, x, w, y);
    conv_backward_data(d, c, n, dy, w, dx, 0);
    conv_backward_data(d, c, n, dy, w, dx_acc, 1);
    conv_backward_filter(d, c, n, x, dy, dw, 1);
    conv_backward_filter(d, c, n, x, dy, dw_new, 0); /* over the same prior: must be overwritten */
    if (prepared)
        ck_assert_msg(d->mem_cur == cur && d->n_allocs == n_allocs,
                      "%s n=%d: a prepared conv allocated in the step", tag, n);

    EXPECT_GPU_CLOSE(d, y, ry, yn, TOL_CONV, "%s n=%d conv_forward", tag, n);
    EXPECT_GPU_CLOSE(d, dx, rdx, xn, TOL_CONV, "%s n=%d conv_backward_data", tag, n);
    EXPECT_GPU_CLOSE(d, dx_acc, rdx_acc, xn, TOL_CONV, "%s n=%d conv_backward_data accumulate",
                     tag, n);
    EXPECT_GPU_CLOSE(d, dw, rdw, wn, TOL_CONV, "%s n=%d conv_backward_filter (+=)", tag, n);
    EXPECT_GPU_CLOSE(d, dw_new, rdw_new, wn, TOL_CONV, "%s n=%d conv_backward_filter (=)", tag, n);

    device_free(d, x), device_free(d, w), device_free(d, dy), device_free(d, y);
    device_free(d, dx), device_free(d, dx_acc), device_free(d, dw), device_free(d, dw_new);
    free(hx), free(hw), free(hdy), free(hdx0), free(hdw0);
    free(ry), free(rdx), free(rdx_acc), free(rdw), free(rdw_new);
}

START_TEST(test_conv_matches_reference) {
    if (!test_have_gpu("ops_cuda: conv vs reference")) return;
    Device d;
    gpu_open(&d, 0, 0);
    for (size_t i = 0; i < sizeof conv_cfgs / sizeof conv_cfgs[0]; i++) {
        const ConvCfg *k = &conv_cfgs[i];
        char tag[64];
        snprintf(tag, sizeof tag, "conv %d->%d k%d s%d p%d %dx%d", k->cin, k->cout, k->k,
                 k->stride, k->pad, k->h, k->w);
        Conv c = {0};
        conv_shape(&c.s, k->cin, k->cout, k->k, k->stride, k->pad, k->h, k->w);
        /* Two batch sizes in one Conv's plan cache, used alternately, then one never prepared
         * (planned on the spot, as ops.h allows). */
        conv_prepare(&d, &c, 8);
        conv_prepare(&d, &c, 1);
        conv_prepare(&d, &c, 8); /* a second prepare of the same n is a no-op */
        ck_assert_ptr_nonnull(c.plan);
        uint64_t seed = 1000 + 100 * i;
        check_conv(&d, &c, 8, seed, 1, tag);
        check_conv(&d, &c, 1, seed + 10, 1, tag);
        check_conv(&d, &c, 8, seed + 20, 1, tag);
        check_conv(&d, &c, 3, seed + 30, 0, tag);
        conv_release(&d, &c);
        ck_assert_ptr_null(c.plan);
    }
    device_destroy(&d);
}
END_TEST

/* allow_tf32 = 0 (--no-tf32) means true fp32 convolutions (CUDNN_FMA_MATH); allowed, cuDNN's tensor
 * cores round both operands to TF32's 10-bit mantissa. On a shape whose heuristic choice is a
 * tensor-core algorithm (ResNet-18's layer 2 at batch 32), TF32 shows against the reference — its
 * error is the proof that the shape exercises the switch — and fp32 must stay a plain fp32 sum's.
 * The tests above may not tell them apart: on their small shapes a TF32 result passed TOL_CONV. */
START_TEST(test_conv_without_tf32_is_fp32) {
    if (!test_have_gpu("ops_cuda: --no-tf32 convolutions in true fp32")) return;
    Conv c = {0};
    conv_shape(&c.s, 128, 128, 3, 1, 1, 16, 16);
    const int n = 32;
    const int64_t xn = (int64_t)n * 128 * 256, wn = 128 * 128 * 9;
    float *hx = hrand(xn, 81, -1.f, 1.f), *hw = hrand(wn, 82, -0.5f, 0.5f), *ry = hzeros(xn), *hy = hzeros(xn);
    ref_conv_forward_f32(&c.s, n, hx, hw, ry);
    double err[2];
    for (int tf32 = 0; tf32 <= 1; tf32++) {
        Device d;
        gpu_open(&d, 0, 0);
        if (tf32) { /* gpu_open is true fp32; the same device with TF32 allowed */
            device_destroy(&d);
            memset(&d, 0, sizeof d);
            d.allow_tf32 = 1;
            device_init(&d, DEV_CUDA, 0, 0);
        }
        float *x = up(&d, hx, xn), *w = up(&d, hw, wn), *y = dzeros(&d, xn);
        conv_forward(&d, &c, n, x, w, y);
        device_copy_d2h(&d, hy, y, (size_t)xn * sizeof(float));
        err[tf32] = test_rel_err(hy, ry, xn);
        device_free(&d, x), device_free(&d, w), device_free(&d, y);
        conv_release(&d, &c);
        device_destroy(&d);
    }
    printf("conv 128->128 k3 16x16 n=32 against the reference: fp32 %.3g, TF32 allowed %.3g\n", err[0], err[1]);
    ck_assert_msg(err[1] > 1e-4, "with TF32 allowed the error is %.3g: this shape does not exercise TF32", err[1]);
    ck_assert_msg(err[0] <= 2e-5, "with TF32 off the error is %.3g (TF32's: %.3g): not true fp32", err[0], err[1]);
    free(hx), free(hw), free(ry), free(hy);
}
END_TEST

/* Deterministic mode: the same inputs give the same bits, pass after pass, including the
 * backward-filter reduction (where cuDNN's fastest algorithms use atomics). Checked with the
 * heuristic choice and with the benchmark search (which must filter what it measures too). */
START_TEST(test_conv_deterministic) {
    if (!test_have_gpu("ops_cuda: deterministic conv")) return;
    for (int benchmark = 0; benchmark <= 1; benchmark++) {
        Device d;
        gpu_open(&d, 1, benchmark);
        Conv c = {0};
        conv_shape(&c.s, 64, 64, 3, 1, 1, 16, 16);
        const int n = 32;
        int64_t xn = (int64_t)n * 64 * 16 * 16, wn = 64 * 64 * 9;
        float *hx = hrand(xn, 71, -1.f, 1.f), *hdy = hrand(xn, 72, -1.f, 1.f);
        float *hw = hrand(wn, 73, -0.5f, 0.5f);
        float *x = up(&d, hx, xn), *dy = up(&d, hdy, xn), *w = up(&d, hw, wn);
        float *dw1 = dzeros(&d, wn), *dw2 = dzeros(&d, wn), *dx1 = dzeros(&d, xn),
              *dx2 = dzeros(&d, xn), *y1 = dzeros(&d, xn), *y2 = dzeros(&d, xn);
        conv_prepare(&d, &c, n);
        conv_backward_filter(&d, &c, n, x, dy, dw1, 0);
        conv_backward_filter(&d, &c, n, x, dy, dw2, 0);
        conv_backward_data(&d, &c, n, dy, w, dx1, 0);
        conv_backward_data(&d, &c, n, dy, w, dx2, 0);
        conv_forward(&d, &c, n, x, w, y1);
        conv_forward(&d, &c, n, x, w, y2);
        float *a = down(&d, dw1, wn), *b = down(&d, dw2, wn);
        ck_assert_msg(memcmp(a, b, (size_t)wn * sizeof(float)) == 0,
                      "deterministic backward-filter differs between runs (benchmark=%d)",
                      benchmark);
        /* and it is still the right answer. The oracle runs in double here: these are sums of
         * n·16·16 = 8192 products, where the float reference's own rounding (~1e-5) would be most
         * of what we measure. */
        double *x64 = malloc((size_t)xn * sizeof(double));
        double *dy64 = malloc((size_t)xn * sizeof(double));
        double *dw64 = calloc((size_t)wn, sizeof(double));
        for (int64_t i = 0; i < xn; i++) x64[i] = hx[i], dy64[i] = hdy[i];
        ref_conv_backward_filter_f64(&c.s, n, x64, dy64, dw64, 0);
        float *rdw = hzeros(wn);
        for (int64_t i = 0; i < wn; i++) rdw[i] = (float)dw64[i];
        free(x64), free(dy64), free(dw64);
        EXPECT_CLOSE(a, rdw, wn, TOL_CONV, "deterministic backward-filter (benchmark=%d)",
                     benchmark);
        free(a), free(b), free(rdw);
        a = down(&d, dx1, xn), b = down(&d, dx2, xn);
        ck_assert_msg(memcmp(a, b, (size_t)xn * sizeof(float)) == 0,
                      "deterministic backward-data differs between runs (benchmark=%d)", benchmark);
        free(a), free(b);
        a = down(&d, y1, xn), b = down(&d, y2, xn);
        ck_assert_msg(memcmp(a, b, (size_t)xn * sizeof(float)) == 0,
                      "deterministic forward differs between runs (benchmark=%d)", benchmark);
        free(a), free(b);
        conv_release(&d, &c);
        free(hx), free(hdy), free(hw);
        device_destroy(&d);
    }
}
END_TEST

/* Benchmark mode: algorithms chosen by measurement still compute the right thing, and the search's
 * scratch tensors and workspace went through the memory account (they show in mem_peak, as in
 * torch.cuda.max_memory_allocated) while only the chosen workspace stays allocated. */
START_TEST(test_conv_benchmark) {
    if (!test_have_gpu("ops_cuda: conv benchmark mode")) return;
    Device d;
    gpu_open(&d, 0, 1);
    Conv c = {0};
    conv_shape(&c.s, 64, 64, 3, 1, 1, 16, 16);
    const int n = 32;
    device_reset_peak(&d);
    size_t cur0 = d.mem_cur, ws0 = d.workspace_bytes;
    conv_prepare(&d, &c, n);
    size_t scratch = (size_t)n * 64 * 16 * 16 * sizeof(float) * 2 + 64 * 64 * 9 * sizeof(float);
    ck_assert_msg(d.mem_peak >= cur0 + scratch,
                  "benchmark search scratch not accounted: peak grew by %zu, scratch is %zu",
                  d.mem_peak - cur0, scratch);
    ck_assert_msg(d.mem_peak - cur0 >= d.workspace_bytes - ws0,
                  "peak grew by %zu, less than the workspace growth %zu", d.mem_peak - cur0,
                  d.workspace_bytes - ws0);
    ck_assert(d.mem_peak >= d.mem_cur);
    /* the scratch is gone again: what remains is at most the (512-rounded) workspace */
    ck_assert_msg(d.mem_cur <= cur0 + d.workspace_bytes + 512,
                  "benchmark search leaked memory: %zu bytes in use, workspace %zu",
                  d.mem_cur - cur0, d.workspace_bytes);
    check_conv(&d, &c, n, 333, 1, "benchmark conv 64->64 k3");
    /* a stride-2 shape, measured too */
    Conv c2 = {0};
    conv_shape(&c2.s, 32, 64, 3, 2, 1, 16, 16);
    conv_prepare(&d, &c2, 16);
    check_conv(&d, &c2, 16, 444, 1, "benchmark conv 32->64 k3 s2");
    conv_release(&d, &c);
    conv_release(&d, &c2);
    device_destroy(&d);
}
END_TEST

/* ---- batch norm ------------------------------------------------------------------------------ */

/* x uniform in [lo, hi]: a non-zero mean and non-unit spread, so mean and variance handling both
 * matter; or a spread so small (±1e-2: variance ~3e-5) that eps (1e-5) changes invstd by 15%, so
 * eps must sit under the square root, as in PyTorch (1/√(var + eps), not 1/(√var + eps)) */
static void check_bn(Device *d, int n, int c, int hw, uint64_t seed, float lo, float hi) {
    int64_t cnt = (int64_t)n * c * hw;
    float *hx = hrand(cnt, seed, lo, hi), *hdy = hrand(cnt, seed + 1, -1.f, 1.f);
    float *hg = hrand(c, seed + 2, 0.5f, 1.5f), *hb = hrand(c, seed + 3, -0.5f, 0.5f);
    float *hrm = hrand(c, seed + 4, -0.2f, 0.2f), *hrv = hrand(c, seed + 5, 0.5f, 2.f);
    float *hdx0 = hrand(cnt, seed + 6, -1.f, 1.f), *hdg0 = hrand(c, seed + 7, -1.f, 1.f);
    float *hdb0 = hrand(c, seed + 8, -1.f, 1.f);
    hrv[c - 1] = 1e-6f; /* below eps: the eval forward must add eps (1/√1e-6 vs 1/√1.1e-5) */

    /* reference: train forward, then backward twice (overwrite, then accumulate into a non-zero
     * dx), both adding into the same dgamma/dbeta; then eval forward with the original stats */
    float *ry = hzeros(cnt), *rrm = hcopy(hrm, c), *rrv = hcopy(hrv, c), *rsm = hzeros(c),
          *rsi = hzeros(c), *rdx = hzeros(cnt), *rdx_acc = hcopy(hdx0, cnt), *rdg = hcopy(hdg0, c),
          *rdb = hcopy(hdb0, c), *rye = hzeros(cnt);
    ref_bn_forward_train_f32(n, c, hw, hx, hg, hb, rrm, rrv, BN_MOMENTUM, BN_EPS, rsm, rsi, ry);
    ref_bn_backward_f32(n, c, hw, hx, hdy, hg, rsm, rsi, BN_EPS, rdx, rdg, rdb, 0);
    ref_bn_backward_f32(n, c, hw, hx, hdy, hg, rsm, rsi, BN_EPS, rdx_acc, rdg, rdb, 1);
    ref_bn_forward_eval_f32(n, c, hw, hx, hg, hb, hrm, hrv, BN_EPS, rye);

    float *x = up(d, hx, cnt), *dy = up(d, hdy, cnt), *g = up(d, hg, c), *b = up(d, hb, c);
    float *rm = up(d, hrm, c), *rv = up(d, hrv, c), *rm0 = up(d, hrm, c), *rv0 = up(d, hrv, c);
    float *sm = dzeros(d, c), *si = dzeros(d, c), *y = dzeros(d, cnt), *ye = dzeros(d, cnt);
    float *dx = up(d, hdx0, cnt), *dx_acc = up(d, hdx0, cnt), *dg = up(d, hdg0, c),
          *db = up(d, hdb0, c);
    bn_prepare(d, 0, n, c, hw);
    bn_forward_train(d, n, c, hw, x, g, b, rm, rv, BN_MOMENTUM, BN_EPS, sm, si, y);
    bn_backward(d, n, c, hw, x, dy, g, sm, si, BN_EPS, dx, dg, db, 0);
    bn_backward(d, n, c, hw, x, dy, g, sm, si, BN_EPS, dx_acc, dg, db, 1);
    bn_forward_eval(d, n, c, hw, x, g, b, rm0, rv0, BN_EPS, ye);

    char tag[64];
    snprintf(tag, sizeof tag, "bn n=%d c=%d hw=%d", n, c, hw);
    EXPECT_GPU_CLOSE(d, y, ry, cnt, TOL_SUM, "%s train y", tag);
    EXPECT_GPU_CLOSE(d, rm, rrm, c, TOL_SUM, "%s running_mean", tag);
    EXPECT_GPU_CLOSE(d, rv, rrv, c, TOL_SUM, "%s running_var (unbiased update)", tag);
    EXPECT_GPU_CLOSE(d, sm, rsm, c, TOL_SUM, "%s save_mean", tag);
    EXPECT_GPU_CLOSE(d, si, rsi, c, TOL_SUM, "%s save_invstd", tag);
    EXPECT_GPU_CLOSE(d, dx, rdx, cnt, TOL_SUM, "%s backward dx", tag);
    EXPECT_GPU_CLOSE(d, dx_acc, rdx_acc, cnt, TOL_SUM, "%s backward dx accumulate", tag);
    EXPECT_GPU_CLOSE(d, dg, rdg, c, TOL_SUM, "%s dgamma (+= twice)", tag);
    EXPECT_GPU_CLOSE(d, db, rdb, c, TOL_SUM, "%s dbeta (+= twice)", tag);
    EXPECT_GPU_CLOSE(d, ye, rye, cnt, TOL_SUM, "%s eval y", tag);

    device_free(d, x), device_free(d, dy), device_free(d, g), device_free(d, b);
    device_free(d, rm), device_free(d, rv), device_free(d, rm0), device_free(d, rv0);
    device_free(d, sm), device_free(d, si), device_free(d, y), device_free(d, ye);
    device_free(d, dx), device_free(d, dx_acc), device_free(d, dg), device_free(d, db);
    free(hx), free(hdy), free(hg), free(hb), free(hrm), free(hrv), free(hdx0), free(hdg0),
        free(hdb0);
    free(ry), free(rrm), free(rrv), free(rsm), free(rsi), free(rdx), free(rdx_acc), free(rdg),
        free(rdb), free(rye);
}

START_TEST(test_bn_matches_reference) {
    if (!test_have_gpu("ops_cuda: batch norm vs reference")) return;
    Device d;
    gpu_open(&d, 0, 0);
    check_bn(&d, 8, 16, 36, 2000, -2.f, 3.f);    /* a late ResNet stage: small images */
    check_bn(&d, 4, 8, 1024, 2100, -2.f, 3.f);   /* the stem: 32×32 images, long per-channel reductions */
    check_bn(&d, 2, 3, 5, 2200, -2.f, 3.f);      /* tiny and odd-sized */
    check_bn(&d, 8, 16, 36, 2300, -1e-2f, 1e-2f); /* variance comparable to eps */
    device_destroy(&d);
}
END_TEST

/* ---- elementwise, pooling -------------------------------------------------------------------- */

START_TEST(test_elementwise_matches_reference) {
    if (!test_have_gpu("ops_cuda: elementwise vs reference")) return;
    Device d;
    gpu_open(&d, 0, 0);
    const int64_t n = 10007; /* not a multiple of the block size: exercises the tail */
    float *ha = hrand(n, 3000, -1.f, 1.f), *hb = hrand(n, 3001, -1.f, 1.f);
    float *hc = hrand(n, 3002, -1.f, 1.f);
    float *a = up(&d, ha, n), *b = up(&d, hb, n), *y = dzeros(&d, n);
    float *r = hzeros(n), *r2 = hcopy(hc, n);

    /* relu forward, out of place and in place */
    ref_relu_forward_f32(n, ha, r);
    relu_forward(&d, n, a, y);
    EXPECT_GPU_EXACT(&d, y, r, n, "relu_forward");
    float *a2 = up(&d, ha, n);
    relu_forward(&d, n, a2, a2);
    EXPECT_GPU_EXACT(&d, a2, r, n, "relu_forward in place");

    /* relu backward from the forward output r: overwrite, accumulate, and in place (dx == dy) */
    float *hy = hcopy(r, n), *dy = up(&d, hb, n), *dx = up(&d, hc, n);
    float *ry = y; /* y holds relu(a) on the device */
    ref_relu_backward_f32(n, hy, hb, r, 0);
    relu_backward(&d, n, ry, dy, dx, 0);
    EXPECT_GPU_EXACT(&d, dx, r, n, "relu_backward");
    ref_relu_backward_f32(n, hy, hb, r2, 1);
    float *dx_acc = up(&d, hc, n);
    relu_backward(&d, n, ry, dy, dx_acc, 1);
    EXPECT_GPU_EXACT(&d, dx_acc, r2, n, "relu_backward accumulate");
    float *dyi = up(&d, hb, n);
    ref_relu_backward_f32(n, hy, hb, r, 0);
    relu_backward(&d, n, ry, dyi, dyi, 0);
    EXPECT_GPU_EXACT(&d, dyi, r, n, "relu_backward in place");

    /* add */
    ref_add_forward_f32(n, ha, hb, r);
    add_forward(&d, n, a, b, y);
    EXPECT_GPU_EXACT(&d, y, r, n, "add_forward");

    /* grad_pass: copy, then add */
    float *dst = up(&d, hc, n);
    grad_pass(&d, n, a, dst, 0);
    EXPECT_GPU_EXACT(&d, dst, ha, n, "grad_pass copy");
    memcpy(r, hc, (size_t)n * sizeof(float));
    ref_grad_pass_f32(n, hb, r, 1);
    float *dst2 = up(&d, hc, n);
    grad_pass(&d, n, b, dst2, 1);
    EXPECT_GPU_EXACT(&d, dst2, r, n, "grad_pass accumulate");
    ref_grad_pass_f32(n, r, r, 1); /* src == dst: copying is a no-op, accumulating doubles */
    grad_pass(&d, n, dst2, dst2, 1);
    EXPECT_GPU_EXACT(&d, dst2, r, n, "grad_pass accumulate onto itself");

    /* scale_inplace, add_inplace */
    memcpy(r, ha, (size_t)n * sizeof(float));
    ref_scale_inplace_f32(n, r, 0.37f);
    float *s = up(&d, ha, n);
    scale_inplace(&d, n, s, 0.37f);
    EXPECT_GPU_EXACT(&d, s, r, n, "scale_inplace");
    memcpy(r, hb, (size_t)n * sizeof(float));
    ref_add_inplace_f32(n, ha, r);
    float *t = up(&d, hb, n);
    add_inplace(&d, n, a, t);
    EXPECT_GPU_EXACT(&d, t, r, n, "add_inplace");

    /* a zero count launches nothing and touches nothing */
    relu_forward(&d, 0, a, y);
    add_inplace(&d, 0, a, t);
    device_sync(&d);

    free(ha), free(hb), free(hc), free(r), free(r2), free(hy);
    device_destroy(&d);
}
END_TEST

START_TEST(test_avgpool_matches_reference) {
    if (!test_have_gpu("ops_cuda: avgpool vs reference")) return;
    Device d;
    gpu_open(&d, 0, 0);
    const int n = 8, c = 64, hw = 16; /* ResNet-18 CIFAR: 512 channels of 4×4 in the real model */
    int64_t xn = (int64_t)n * c * hw, yn = (int64_t)n * c;
    float *hx = hrand(xn, 4000, -1.f, 1.f), *hdy = hrand(yn, 4001, -1.f, 1.f);
    float *hdx0 = hrand(xn, 4002, -1.f, 1.f);
    float *ry = hzeros(yn), *rdx = hzeros(xn), *rdx_acc = hcopy(hdx0, xn);
    ref_avgpool_forward_f32(n, c, hw, hx, ry);
    ref_avgpool_backward_f32(n, c, hw, hdy, rdx, 0);
    ref_avgpool_backward_f32(n, c, hw, hdy, rdx_acc, 1);
    float *x = up(&d, hx, xn), *y = dzeros(&d, yn), *dy = up(&d, hdy, yn);
    float *dx = up(&d, hdx0, xn), *dx_acc = up(&d, hdx0, xn);
    avgpool_forward(&d, n, c, hw, x, y);
    avgpool_backward(&d, n, c, hw, dy, dx, 0);
    avgpool_backward(&d, n, c, hw, dy, dx_acc, 1);
    EXPECT_GPU_CLOSE(&d, y, ry, yn, TOL_ELEM, "avgpool_forward");
    EXPECT_GPU_CLOSE(&d, dx, rdx, xn, TOL_ELEM, "avgpool_backward");
    EXPECT_GPU_CLOSE(&d, dx_acc, rdx_acc, xn, TOL_ELEM, "avgpool_backward accumulate");
    free(hx), free(hdy), free(hdx0), free(ry), free(rdx), free(rdx_acc);
    device_destroy(&d);
}
END_TEST

/* ---- linear ---------------------------------------------------------------------------------- */

static void check_linear(Device *d, int n, int in, int out, uint64_t seed) {
    int64_t xn = (int64_t)n * in, wn = (int64_t)out * in, yn = (int64_t)n * out;
    float *hx = hrand(xn, seed, -1.f, 1.f), *hW = hrand(wn, seed + 1, -0.5f, 0.5f);
    float *hb = hrand(out, seed + 2, -0.5f, 0.5f), *hdy = hrand(yn, seed + 3, -1.f, 1.f);
    float *hdx0 = hrand(xn, seed + 4, -1.f, 1.f), *hdW0 = hrand(wn, seed + 5, -1.f, 1.f);
    float *hdb0 = hrand(out, seed + 6, -1.f, 1.f);
    /* reference: forward; backward overwriting dx, then accumulating into a non-zero dx; dW and db
     * receive both calls' gradients on top of their initial values */
    float *ry = hzeros(yn), *rdx = hzeros(xn), *rdx_acc = hcopy(hdx0, xn), *rdW = hcopy(hdW0, wn),
          *rdb = hcopy(hdb0, out);
    ref_linear_forward_f32(n, in, out, hx, hW, hb, ry);
    ref_linear_backward_f32(n, in, out, hx, hW, hdy, rdx, rdW, rdb, 0);
    ref_linear_backward_f32(n, in, out, hx, hW, hdy, rdx_acc, rdW, rdb, 1);

    float *x = up(d, hx, xn), *W = up(d, hW, wn), *b = up(d, hb, out), *dy = up(d, hdy, yn);
    float *y = dzeros(d, yn), *dx = up(d, hdx0, xn), *dx_acc = up(d, hdx0, xn);
    float *dW = up(d, hdW0, wn), *db = up(d, hdb0, out);
    linear_forward(d, n, in, out, x, W, b, y);
    linear_backward(d, n, in, out, x, W, dy, dx, dW, db, 0);
    linear_backward(d, n, in, out, x, W, dy, dx_acc, dW, db, 1);

    char tag[64];
    snprintf(tag, sizeof tag, "linear n=%d in=%d out=%d", n, in, out);
    EXPECT_GPU_CLOSE(d, y, ry, yn, TOL_SUM, "%s forward", tag);
    EXPECT_GPU_CLOSE(d, dx, rdx, xn, TOL_SUM, "%s dx", tag);
    EXPECT_GPU_CLOSE(d, dx_acc, rdx_acc, xn, TOL_SUM, "%s dx accumulate", tag);
    EXPECT_GPU_CLOSE(d, dW, rdW, wn, TOL_SUM, "%s dW (+= twice)", tag);
    EXPECT_GPU_CLOSE(d, db, rdb, out, TOL_SUM, "%s db (+= twice)", tag);

    device_free(d, x), device_free(d, W), device_free(d, b), device_free(d, dy);
    device_free(d, y), device_free(d, dx), device_free(d, dx_acc), device_free(d, dW),
        device_free(d, db);
    free(hx), free(hW), free(hb), free(hdy), free(hdx0), free(hdW0), free(hdb0);
    free(ry), free(rdx), free(rdx_acc), free(rdW), free(rdb);
}

START_TEST(test_linear_matches_reference) {
    if (!test_have_gpu("ops_cuda: linear vs reference")) return;
    Device d;
    gpu_open(&d, 0, 0);
    check_linear(&d, 8, 64, 10, 5000);
    check_linear(&d, 33, 512, 10, 5100); /* ResNet-18's head, odd batch */
    check_linear(&d, 1, 7, 3, 5200);     /* degenerate sizes */
    check_linear(&d, 300, 24, 17, 5300); /* more rows than columns, odd everything */
    device_destroy(&d);
}
END_TEST

/* ---- softmax + cross-entropy ----------------------------------------------------------------- */

static void check_xent(Device *d, int n, int classes, float scale, uint64_t seed, int with_ties) {
    int64_t cnt = (int64_t)n * classes;
    float *hz = hrand(cnt, seed, -3.f, 3.f), *u = hrand(n, seed + 1, 0.f, 1.f);
    int32_t *hl = malloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        hl[i] = (int32_t)(u[i] * (float)classes);
        if (hl[i] >= classes) hl[i] = classes - 1;
    }
    if (with_ties) {
        /* argmax takes the FIRST maximum (torch.argmax): an all-equal row is "correct" only for
         * label 0, and a row with two equal maxima only for the earlier one. Rows 0 and 2 count
         * only with the first maximum, row 3 only with the last, so taking the last changes the
         * count (with one row of each kind it would not: +1 −1) */
        ck_assert_int_ge(n, 4);
        ck_assert_int_ge(classes, 8);
        for (int j = 0; j < classes; j++) hz[j] = hz[classes + j] = 0.5f;
        hl[0] = 0, hl[1] = 5;
        hz[2 * classes + 3] = hz[2 * classes + 7] = 10.f;
        hz[3 * classes + 3] = hz[3 * classes + 7] = 10.f;
        hl[2] = 3, hl[3] = 7;
    }
    float rloss = 0, *rdz = hzeros(cnt);
    int32_t rcorrect = -1;
    ref_xent_forward_backward_f32(n, classes, hz, hl, scale, &rloss, &rcorrect, rdz);

    float *z = up(d, hz, cnt), *dz = dzeros(d, cnt), *loss = dzeros(d, 1);
    int32_t *labels = device_alloc(d, (size_t)n * sizeof(int32_t), "test labels");
    int32_t *correct = device_alloc(d, sizeof(int32_t), "test correct");
    device_copy_h2d(d, labels, hl, (size_t)n * sizeof(int32_t));
    device_memset0(d, correct, sizeof(int32_t));

    char tag[64];
    snprintf(tag, sizeof tag, "xent n=%d classes=%d", n, classes);
    float gloss[2];
    int32_t gcorrect[2];
    float *gdz[2];
    for (int run = 0; run < 2; run++) { /* twice: the result must be bit-reproducible */
        xent_forward_backward(d, n, classes, z, labels, scale, loss, correct, dz);
        device_copy_d2h(d, &gloss[run], loss, sizeof(float));
        device_copy_d2h(d, &gcorrect[run], correct, sizeof(int32_t));
        gdz[run] = down(d, dz, cnt);
    }
    EXPECT_CLOSE(&gloss[0], &rloss, 1, TOL_ELEM, "%s loss (%g vs %g)", tag, (double)gloss[0],
                 (double)rloss);
    ck_assert_msg(gcorrect[0] == rcorrect, "%s correct: %d vs %d", tag, gcorrect[0], rcorrect);
    EXPECT_CLOSE(gdz[0], rdz, cnt, TOL_ELEM, "%s dlogits", tag);
    ck_assert_msg(memcmp(&gloss[0], &gloss[1], sizeof(float)) == 0 && gcorrect[0] == gcorrect[1] &&
                      memcmp(gdz[0], gdz[1], (size_t)cnt * sizeof(float)) == 0,
                  "%s: two runs differ", tag);

    /* dlogits may alias logits (the reference allows it; so must we) */
    xent_forward_backward(d, n, classes, z, labels, scale, loss, correct, z);
    EXPECT_GPU_CLOSE(d, z, rdz, cnt, TOL_ELEM, "%s dlogits in place", tag);

    device_free(d, z), device_free(d, dz), device_free(d, loss), device_free(d, labels),
        device_free(d, correct);
    free(hz), free(u), free(hl), free(rdz), free(gdz[0]), free(gdz[1]);
}

START_TEST(test_xent_matches_reference) {
    if (!test_have_gpu("ops_cuda: softmax cross-entropy vs reference")) return;
    Device d;
    gpu_open(&d, 0, 0);
    check_xent(&d, 37, 10, 1.f / 128.f, 6000, 1); /* DataParallel-style scale 1/global batch */
    check_xent(&d, 128, 10, 1.f / 128.f, 6100, 0);
    check_xent(&d, 1000, 10, 1.f / 1000.f, 6200, 0); /* many rows per warp */
    check_xent(&d, 5, 1000, 1.f / 5.f, 6300, 1);     /* many classes per lane */
    device_destroy(&d);
}
END_TEST

/* A NaN logit is the row's maximum (torch.argmax: the first NaN wins). Each row below puts a NaN
 * after a larger finite logit, in another lane; when the warp's max-merge ignored NaNs (one lane
 * kept the NaN, lane 0 the finite maximum) row 0 of the 10-class case counted as wrong. */
START_TEST(test_xent_nan_is_the_maximum) {
    if (!test_have_gpu("ops_cuda: softmax cross-entropy, NaN logits")) return;
    Device d;
    gpu_open(&d, 0, 0);
    const int cls[2] = {10, 100};
    for (int k = 0; k < 2; k++) {
        const int n = 4, classes = cls[k];
        const int64_t cnt = (int64_t)n * classes;
        float *hz = hrand(cnt, 6400 + k, -3.f, 3.f);
        int32_t hl[4];
        /* row 0: 10 at 3, NaN at 5; row 1: NaNs at the last and at 1; row 2: NaN at 0; row 3: none */
        hz[3] = 10.f, hz[5] = NAN, hl[0] = 5;
        hz[classes + classes - 1] = NAN, hz[classes + 1] = NAN, hz[classes + 2] = 10.f, hl[1] = 1;
        hz[2 * classes] = NAN, hz[2 * classes + classes / 2] = 10.f, hl[2] = 0;
        hz[3 * classes + 7] = 10.f, hl[3] = 7;
        float rloss = 0, *rdz = hzeros(cnt);
        int32_t rcorrect = -1;
        ref_xent_forward_backward_f32(n, classes, hz, hl, 1.f / n, &rloss, &rcorrect, rdz);
        ck_assert_int_eq(rcorrect, 4);
        float *z = up(&d, hz, cnt), *dz = dzeros(&d, cnt), *loss = dzeros(&d, 1);
        int32_t *labels = device_alloc(&d, sizeof hl, "test labels");
        int32_t *correct = device_alloc(&d, sizeof(int32_t), "test correct");
        device_copy_h2d(&d, labels, hl, sizeof hl);
        xent_forward_backward(&d, n, classes, z, labels, 1.f / n, loss, correct, dz);
        float gloss;
        int32_t gcorrect;
        device_copy_d2h(&d, &gloss, loss, sizeof gloss);
        device_copy_d2h(&d, &gcorrect, correct, sizeof gcorrect);
        ck_assert_msg(gcorrect == rcorrect, "xent classes=%d with NaN logits: correct %d, reference %d", classes,
                      gcorrect, rcorrect);
        ck_assert_msg(isnan(gloss) && isnan(rloss), "xent classes=%d with NaN logits: loss %g, reference %g",
                      classes, (double)gloss, (double)rloss);
        device_free(&d, z), device_free(&d, dz), device_free(&d, loss), device_free(&d, labels);
        device_free(&d, correct);
        free(hz), free(rdz);
    }
    device_destroy(&d);
}
END_TEST

/* ---- SGD ------------------------------------------------------------------------------------- */

/* Four optimizer steps (the first initialises the momentum buffer) on params[off .. off+count),
 * against the reference. off = 1 makes the pointers misaligned for float4. */
static void check_sgd(Device *d, int64_t count, int64_t off, float momentum, uint64_t seed) {
    const float lr = 0.1f, wd = 5e-4f;
    int64_t total = count + off;
    float *hp = hrand(total, seed, -1.f, 1.f), *hbuf = hrand(total, seed + 1, -1.f, 1.f);
    float *p = up(d, hp, total), *buf = up(d, hbuf, total), *g = dzeros(d, total);
    float *rp = hcopy(hp, total), *rbuf = hcopy(hbuf, total);
    for (int step = 0; step < 4; step++) {
        float *hg = hrand(total, seed + 10 + step, -1.f, 1.f);
        device_copy_h2d(d, g, hg, (size_t)total * sizeof(float));
        float *b_dev = momentum != 0.f ? buf + off : NULL;
        float *b_ref = momentum != 0.f ? rbuf + off : NULL;
        ref_sgd_step_f32(count, rp + off, hg + off, b_ref, lr, momentum, wd, step == 0);
        sgd_step(d, count, p + off, g + off, b_dev, lr, momentum, wd, step == 0);
        device_sync(d); /* hg is reused by the next step's copy */
        free(hg);
        char tag[96];
        snprintf(tag, sizeof tag, "sgd count=%lld off=%lld momentum=%g step %d", (long long)count,
                 (long long)off, (double)momentum, step);
        EXPECT_GPU_CLOSE(d, p, rp, total, TOL_ELEM, "%s params", tag);
        if (momentum != 0.f)
            EXPECT_GPU_CLOSE(d, buf, rbuf, total, TOL_ELEM, "%s momentum buf", tag);
    }
    /* elements outside the slice are untouched */
    float *gp = down(d, p, total);
    for (int64_t i = 0; i < off; i++) ck_assert(gp[i] == hp[i]);
    free(gp);
    device_free(d, p), device_free(d, buf), device_free(d, g);
    free(hp), free(hbuf), free(rp), free(rbuf);
}

START_TEST(test_sgd_matches_reference) {
    if (!test_have_gpu("ops_cuda: sgd vs reference")) return;
    Device d;
    gpu_open(&d, 0, 0);
    check_sgd(&d, 10000, 0, 0.9f, 7000); /* aligned, multiple of 4: the float4 path */
    check_sgd(&d, 10003, 0, 0.9f, 7100); /* ragged count: the scalar path */
    check_sgd(&d, 9996, 1, 0.9f, 7200);  /* multiple of 4 but misaligned: must use scalar */
    check_sgd(&d, 10000, 0, 0.f, 7300);  /* plain SGD: no momentum buffer at all (NULL) */
    check_sgd(&d, 10003, 0, 0.f, 7400);
    device_destroy(&d);
}
END_TEST

/* ================================================================================================
 * Mixed precision: the 16-bit CUDA ops against the CPU backend's emulation (ops_ref.c), on inputs
 * that are p values. Both compute in fp32 and round each stored value once; they differ only in
 * the order of fp32 sums (and float vs double in batch norm's statistics), which can move a result
 * across a rounding boundary: one ulp of p at most in an element, i.e. ≤ u relative to the
 * tensor's largest value (u = 2^-11 fp16, 2^-8 bf16). Tolerance TOL_LP = 2u (+ TOL_SUM for cuDNN's
 * Winograd/FFT transforms). Ops with one rounding of the same fp32 value on both sides (casts,
 * relu, add, accumulate, the GradScaler's scalar rules, the skipping SGD) must match exactly.
 * bf16 needs compute capability 8.0 for cuDNN and cuBLAS: below that only fp16 is tested.
 * ============================================================================================== */

static double u_of(Precision p) { return p == PREC_FP16 ? 1.0 / 2048 : 1.0 / 256; }
#define TOL_LP(p) (2 * u_of(p) + TOL_SUM)

/* host floats (rounded to p here) → a 16-bit device tensor */
static void *up_lp(Device *d, Precision p, float *h, int64_t n) {
    precision_round_array(p, n, h);
    uint16_t *b = malloc((size_t)(n > 0 ? n : 1) * 2);
    precision_pack(p, n, h, b);
    void *dev = device_alloc(d, (size_t)n * 2, "test tensor (16-bit)");
    device_copy_h2d(d, dev, b, (size_t)n * 2);
    device_sync(d);
    free(b);
    return dev;
}

static float *down_lp(Device *d, Precision p, const void *dev, int64_t n) {
    uint16_t *b = malloc((size_t)(n > 0 ? n : 1) * 2);
    float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    device_copy_d2h(d, b, dev, (size_t)n * 2);
    precision_unpack(p, n, b, h);
    free(b);
    return h;
}

#define EXPECT_LP_CLOSE(d, p, dev, want, n, tol, ...)                                              \
    do {                                                                                           \
        float *g_ = down_lp((d), (p), (dev), (n));                                                 \
        EXPECT_CLOSE(g_, (want), (n), (tol), __VA_ARGS__);                                         \
        free(g_);                                                                                  \
    } while (0)

#define EXPECT_LP_EXACT(d, p, dev, want, n, what)                                                  \
    do {                                                                                           \
        float *g_ = down_lp((d), (p), (dev), (n));                                                 \
        for (int64_t i_ = 0; i_ < (n); i_++)                                                       \
            ck_assert_msg(g_[i_] == (want)[i_] || (isnan(g_[i_]) && isnan((want)[i_])),           \
                          "%s %s: element %lld is %g, emulation %g", (what), precision_name(p),   \
                          (long long)i_, (double)g_[i_], (double)(want)[i_]);                      \
        free(g_);                                                                                  \
    } while (0)

/* The types this GPU can run: fp16 always, bf16 from compute capability 8.0. */
static int lp_types(Device *d, Precision *out) {
    int major, n = 0;
    out[n++] = PREC_FP16;
    if (amp_bf16_supported(d, &major)) out[n++] = PREC_BF16;
    else printf("SKIP: bf16 ops — compute capability %d.x < 8.0\n", major);
    return n;
}

START_TEST(test_lp_elementwise_exact) {
    if (!test_have_gpu("ops_cuda: fp16/bf16 casts and elementwise vs emulation")) return;
    Device d;
    gpu_open(&d, 0, 0);
    Precision ps[2];
    int np = lp_types(&d, ps);
    for (int k = 0; k < np; k++) {
        Precision p = ps[k];
        int64_t n = 5000;
        /* casts: specials, overflow, subnormals and ties, then random values over fp16's range */
        float *h = hrand(n, 8000, -4.f, 4.f);
        float spec[] = {0.f, -0.f, INFINITY, -INFINITY, NAN, 65504.f, 65520.f, 65519.f, 1e5f, 0x1p-24f,
                        0x1p-25f, 0x1.8p-24f, 1e-8f, 1e30f, 1.0f + 0x1p-11f, 1.0f + 0x1p-8f, 3e-39f};
        memcpy(h, spec, sizeof spec);
        /* NaNs with their payload only in the bits rounding drops: must stay NaN, not become ±inf */
        const uint32_t nans[] = {0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7f801000u};
        memcpy(h + sizeof spec / sizeof spec[0], nans, sizeof nans);
        for (int64_t i = 100; i < n; i++) h[i] = ldexpf(h[i], (int)(i % 40) - 26);
        float *x = up(&d, h, n), *want = hcopy(h, n);
        void *xl = device_alloc(&d, (size_t)n * 2, "lp");
        cast_to(&d, p, n, x, xl);
        ref_cast_to_lp(p, n, h, want);
        EXPECT_LP_EXACT(&d, p, xl, want, n, "cast_to (fp32 → 16 bits, round to nearest even)");
        float *back = dzeros(&d, n);
        cast_from(&d, p, n, xl, back);
        EXPECT_GPU_EXACT(&d, back, want, n, "cast_from (exact widening)");
        /* relu, add, accumulate on p values */
        float *ha = hrand(n, 8100, -3.f, 3.f), *hb = hrand(n, 8200, -3.f, 3.f);
        void *a = up_lp(&d, p, ha, n), *b = up_lp(&d, p, hb, n), *y = device_alloc(&d, (size_t)n * 2, "lp");
        float *r = hzeros(n);
        relu_forward_lp(&d, p, n, a, y);
        ref_relu_forward_f32(n, ha, r);
        EXPECT_LP_EXACT(&d, p, y, r, n, "relu forward");
        float *hc = hrand(n, 8300, -3.f, 3.f), *racc = hzeros(n);
        void *dxa = up_lp(&d, p, hc, n);
        ref_cast_to_lp(p, n, hc, racc);
        relu_backward_lp(&d, p, n, y, b, dxa, 1);
        ref_relu_backward_lp(p, n, r, hb, racc, 1);
        EXPECT_LP_EXACT(&d, p, dxa, racc, n, "relu backward, accumulate");
        device_free(&d, dxa), free(hc), free(racc);
        relu_backward_lp(&d, p, n, y, b, y, 0); /* in place, as the model does */
        ref_relu_backward_lp(p, n, r, hb, r, 0);
        EXPECT_LP_EXACT(&d, p, y, r, n, "relu backward");
        add_forward_lp(&d, p, n, a, b, y);
        ref_add_forward_lp(p, n, ha, hb, r);
        EXPECT_LP_EXACT(&d, p, y, r, n, "add");
        grad_pass_lp(&d, p, n, a, y, 1);
        ref_grad_pass_lp(p, n, ha, r, 1);
        EXPECT_LP_EXACT(&d, p, y, r, n, "grad accumulate round(old + new)");
        /* pooling: fp32 sums in another order (forward), one division (backward) */
        int pn = 8, pc = 39, hw = 16; /* 4992 elements: inside the n = 5000 buffers */
        avgpool_forward_lp(&d, p, 0, pn, pc, hw, a, y);
        ref_avgpool_forward_lp(p, pn, pc, hw, ha, r);
        EXPECT_LP_CLOSE(&d, p, y, r, pn * pc, TOL_LP(p), "avgpool forward %s", precision_name(p));
        avgpool_backward_lp(&d, p, 0, pn, pc, hw, a, y, 0);
        ref_avgpool_backward_lp(p, pn, pc, hw, ha, r, 0);
        EXPECT_LP_CLOSE(&d, p, y, r, (int64_t)pn * pc * hw, TOL_LP(p), "avgpool backward %s", precision_name(p));
        device_free(&d, x), device_free(&d, xl), device_free(&d, back), device_free(&d, a), device_free(&d, b);
        device_free(&d, y);
        free(h), free(want), free(ha), free(hb), free(r);
    }
    device_destroy(&d);
}
END_TEST

START_TEST(test_lp_conv_matches_emulation) {
    if (!test_have_gpu("ops_cuda: fp16/bf16 convolution vs emulation")) return;
    Device d;
    gpu_open(&d, 0, 0);
    Precision ps[2];
    int np = lp_types(&d, ps);
    for (int k = 0; k < np; k++) {
        Precision p = ps[k];
        for (size_t ci = 0; ci < sizeof conv_cfgs / sizeof conv_cfgs[0]; ci++) {
            const ConvCfg *cf = &conv_cfgs[ci];
            Conv c = {.prec = p};
            conv_shape(&c.s, cf->cin, cf->cout, cf->k, cf->stride, cf->pad, cf->h, cf->w);
            int n = 3;
            int64_t nx = (int64_t)n * cf->cin * cf->h * cf->w, nw = (int64_t)cf->cout * cf->cin * cf->k * cf->k;
            int64_t ny = (int64_t)n * cf->cout * c.s.hout * c.s.wout;
            float *hx = hrand(nx, 8300 + ci, -1.f, 1.f), *hw_ = hrand(nw, 8400 + ci, -0.5f, 0.5f);
            float *hdy = hrand(ny, 8500 + ci, -1.f, 1.f), *hdx0 = hrand(nx, 8600 + ci, -1.f, 1.f);
            void *x = up_lp(&d, p, hx, nx), *w = up_lp(&d, p, hw_, nw), *dy = up_lp(&d, p, hdy, ny);
            void *dxa = up_lp(&d, p, hdx0, nx);
            void *y = device_alloc(&d, ny * 2, "lp"), *dx = device_alloc(&d, nx * 2, "lp"), *dw = device_alloc(&d, nw * 2, "lp");
            float *ry = hzeros(ny), *rdx = hzeros(nx), *rdxa = hcopy(hdx0, nx), *rdw = hzeros(nw);
            conv_forward_lp(&d, &c, p, n, x, w, y);
            ref_conv_forward_lp(p, &c.s, n, hx, hw_, ry);
            conv_backward_data_lp(&d, &c, p, n, dy, w, dx, 0);
            ref_conv_backward_data_lp(p, &c.s, n, hdy, hw_, rdx, 0);
            conv_backward_data_lp(&d, &c, p, n, dy, w, dxa, 1);
            ref_conv_backward_data_lp(p, &c.s, n, hdy, hw_, rdxa, 1);
            conv_backward_filter_lp(&d, &c, p, n, x, dy, dw);
            ref_conv_backward_filter_lp(p, &c.s, n, hx, hdy, rdw);
            char tag[96];
            snprintf(tag, sizeof tag, "conv %s %d->%d k%d s%d", precision_name(p), cf->cin, cf->cout, cf->k, cf->stride);
            EXPECT_LP_CLOSE(&d, p, y, ry, ny, TOL_LP(p), "%s forward", tag);
            EXPECT_LP_CLOSE(&d, p, dx, rdx, nx, TOL_LP(p), "%s backward-data", tag);
            EXPECT_LP_CLOSE(&d, p, dxa, rdxa, nx, TOL_LP(p), "%s backward-data accumulate", tag);
            EXPECT_LP_CLOSE(&d, p, dw, rdw, nw, TOL_LP(p), "%s backward-filter (fresh)", tag);
            conv_release(&d, &c);
            device_free(&d, x), device_free(&d, w), device_free(&d, dy), device_free(&d, dxa);
            device_free(&d, y), device_free(&d, dx), device_free(&d, dw);
            free(hx), free(hw_), free(hdy), free(hdx0), free(ry), free(rdx), free(rdxa), free(rdw);
        }
    }
    device_destroy(&d);
}
END_TEST

START_TEST(test_lp_bn_and_linear_match_emulation) {
    if (!test_have_gpu("ops_cuda: fp16/bf16 batch norm and linear vs emulation")) return;
    Device d;
    gpu_open(&d, 0, 0);
    Precision ps[2];
    int np = lp_types(&d, ps);
    for (int k = 0; k < np; k++) {
        Precision p = ps[k];
        int shapes[3][3] = {{8, 16, 36}, {4, 8, 1024}, {2, 3, 5}};
        for (int si_ = 0; si_ < 3; si_++) {
            int n = shapes[si_][0], c = shapes[si_][1], hw = shapes[si_][2];
            int64_t cnt = (int64_t)n * c * hw;
            float *hx = hrand(cnt, 8700, -2.f, 3.f), *hdy = hrand(cnt, 8701, -1.f, 1.f);
            float *hg = hrand(c, 8702, 0.5f, 1.5f), *hb = hrand(c, 8703, -0.5f, 0.5f);
            float *hrm = hrand(c, 8704, -0.2f, 0.2f), *hrv = hrand(c, 8705, 0.5f, 2.f);
            float *hdx0 = hrand(cnt, 8706, -1.f, 1.f);
            void *x = up_lp(&d, p, hx, cnt), *dy = up_lp(&d, p, hdy, cnt), *dxa = up_lp(&d, p, hdx0, cnt);
            float *g = up(&d, hg, c), *b = up(&d, hb, c), *rm = up(&d, hrm, c), *rv = up(&d, hrv, c);
            float *sm = dzeros(&d, c), *sv = dzeros(&d, c), *dg = dzeros(&d, c), *db = dzeros(&d, c);
            void *y = device_alloc(&d, cnt * 2, "lp"), *dx = device_alloc(&d, cnt * 2, "lp"), *ye = device_alloc(&d, cnt * 2, "lp");
            float *ry = hzeros(cnt), *rrm = hcopy(hrm, c), *rrv = hcopy(hrv, c), *rsm = hzeros(c), *rsv = hzeros(c);
            float *rdx = hzeros(cnt), *rdxa = hcopy(hdx0, cnt), *rdg = hzeros(c), *rdb = hzeros(c), *rye = hzeros(cnt);
            bn_forward_eval_lp(&d, p, 0, n, c, hw, x, g, b, rm, rv, BN_EPS, ye);
            ref_bn_forward_eval_lp(p, n, c, hw, hx, hg, hb, hrm, hrv, BN_EPS, rye);
            bn_prepare(&d, 0, n, c, hw);
            bn_forward_train_lp(&d, p, 0, n, c, hw, x, g, b, rm, rv, BN_MOMENTUM, BN_EPS, sm, sv, y, 0);
            ref_bn_forward_train_lp(p, n, c, hw, hx, hg, hb, rrm, rrv, BN_MOMENTUM, BN_EPS, rsm, rsv, ry);
            bn_backward_lp(&d, p, 0, n, c, hw, x, NULL, dy, g, sm, sv, BN_EPS, dx, dg, db, 0, 0);
            ref_bn_backward_lp(p, n, c, hw, hx, hdy, hg, rsm, rsv, BN_EPS, rdx, rdg, rdb, 0);
            bn_backward_lp(&d, p, 0, n, c, hw, x, NULL, dy, g, sm, sv, BN_EPS, dxa, dg, db, 1, 0);
            ref_bn_backward_lp(p, n, c, hw, hx, hdy, hg, rsm, rsv, BN_EPS, rdxa, rdg, rdb, 1);
            char tag[96];
            snprintf(tag, sizeof tag, "bn %s n=%d c=%d hw=%d", precision_name(p), n, c, hw);
            EXPECT_LP_CLOSE(&d, p, y, ry, cnt, TOL_LP(p), "%s train y", tag);
            EXPECT_LP_CLOSE(&d, p, ye, rye, cnt, TOL_LP(p), "%s eval y", tag);
            EXPECT_GPU_CLOSE(&d, rm, rrm, c, TOL_SUM, "%s running_mean", tag);
            EXPECT_GPU_CLOSE(&d, rv, rrv, c, TOL_SUM, "%s running_var", tag);
            EXPECT_GPU_CLOSE(&d, sm, rsm, c, TOL_SUM, "%s save_mean", tag);
            EXPECT_GPU_CLOSE(&d, sv, rsv, c, TOL_SUM, "%s save_invstd", tag);
            EXPECT_LP_CLOSE(&d, p, dx, rdx, cnt, TOL_LP(p), "%s dx", tag);
            EXPECT_LP_CLOSE(&d, p, dxa, rdxa, cnt, TOL_LP(p), "%s dx accumulate", tag);
            EXPECT_GPU_CLOSE(&d, dg, rdg, c, TOL_SUM, "%s dgamma (fp32, += twice)", tag);
            EXPECT_GPU_CLOSE(&d, db, rdb, c, TOL_SUM, "%s dbeta (fp32, += twice)", tag);
            device_free(&d, x), device_free(&d, dy), device_free(&d, dxa), device_free(&d, g), device_free(&d, b);
            device_free(&d, rm), device_free(&d, rv), device_free(&d, sm), device_free(&d, sv), device_free(&d, dg);
            device_free(&d, db), device_free(&d, y), device_free(&d, dx), device_free(&d, ye);
            free(hx), free(hdy), free(hg), free(hb), free(hrm), free(hrv), free(hdx0), free(ry), free(rrm), free(rrv);
            free(rsm), free(rsv), free(rdx), free(rdxa), free(rdg), free(rdb), free(rye);
        }
        /* linear: y = round(x·Wᵀ + b); dx (overwrite, accumulate), dW and db fresh */
        int n = 37, in = 64, out = 10;
        float *hx = hrand(n * in, 8800, -1.f, 1.f), *hW = hrand(out * in, 8801, -0.3f, 0.3f);
        float *hb = hrand(out, 8802, -1.f, 1.f), *hdy = hrand(n * out, 8803, -1.f, 1.f), *hdx0 = hrand(n * in, 8804, -1.f, 1.f);
        void *x = up_lp(&d, p, hx, n * in), *W = up_lp(&d, p, hW, out * in), *b = up_lp(&d, p, hb, out);
        void *dy = up_lp(&d, p, hdy, n * out), *dxa = up_lp(&d, p, hdx0, n * in);
        void *y = device_alloc(&d, n * out * 2, "lp"), *dx = device_alloc(&d, n * in * 2, "lp");
        void *dW = device_alloc(&d, out * in * 2, "lp"), *db = device_alloc(&d, out * 2, "lp");
        float *ry = hzeros(n * out), *rdx = hzeros(n * in), *rdxa = hcopy(hdx0, n * in), *rdW = hzeros(out * in), *rdb = hzeros(out);
        linear_forward_lp(&d, p, n, in, out, x, W, b, y);
        ref_linear_forward_lp(p, n, in, out, hx, hW, hb, ry);
        linear_backward_lp(&d, p, n, in, out, x, W, dy, dx, dW, db, 0);
        ref_linear_backward_lp(p, n, in, out, hx, hW, hdy, rdx, rdW, rdb, 0);
        EXPECT_LP_CLOSE(&d, p, y, ry, n * out, TOL_LP(p), "linear %s forward", precision_name(p));
        EXPECT_LP_CLOSE(&d, p, dx, rdx, n * in, TOL_LP(p), "linear %s dx", precision_name(p));
        EXPECT_LP_CLOSE(&d, p, dW, rdW, out * in, TOL_LP(p), "linear %s dW", precision_name(p));
        EXPECT_LP_CLOSE(&d, p, db, rdb, out, TOL_LP(p), "linear %s db", precision_name(p));
        linear_backward_lp(&d, p, n, in, out, x, W, dy, dxa, dW, db, 1);
        ref_linear_backward_lp(p, n, in, out, hx, hW, hdy, rdxa, rdW, rdb, 1);
        EXPECT_LP_CLOSE(&d, p, dxa, rdxa, n * in, TOL_LP(p), "linear %s dx accumulate", precision_name(p));
        EXPECT_LP_CLOSE(&d, p, dW, rdW, out * in, TOL_LP(p), "linear %s dW again (overwritten)", precision_name(p));
        device_free(&d, x), device_free(&d, W), device_free(&d, b), device_free(&d, dy), device_free(&d, dxa);
        device_free(&d, y), device_free(&d, dx), device_free(&d, dW), device_free(&d, db);
        free(hx), free(hW), free(hb), free(hdy), free(hdx0), free(ry), free(rdx), free(rdxa), free(rdW), free(rdb);
    }
    device_destroy(&d);
}
END_TEST

/* ---- channels-last: the same ops on NHWC tensors (KRSC conv weights) ------------------------- */
/* Inputs are permuted on the host, results permuted back, and compared with the (NCHW) emulation
 * at the same tolerances: the layout must change no value. */

static float *to_nhwc(const float *x, int n, int c, int hw) {
    float *y = malloc((size_t)n * c * hw * sizeof(float));
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (int j = 0; j < hw; j++) y[((int64_t)i * hw + j) * c + ch] = x[((int64_t)i * c + ch) * hw + j];
    return y;
}

static float *from_nhwc(const float *y, int n, int c, int hw) {
    float *x = malloc((size_t)n * c * hw * sizeof(float));
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (int j = 0; j < hw; j++) x[((int64_t)i * c + ch) * hw + j] = y[((int64_t)i * hw + j) * c + ch];
    return x;
}

/* a channels-last device tensor, downloaded and put back in NCHW order */
static float *down_nhwc(Device *d, Precision p, const void *dev, int n, int c, int hw) {
    float *h = down_lp(d, p, dev, (int64_t)n * c * hw), *x = from_nhwc(h, n, c, hw);
    free(h);
    return x;
}

static void *up_nhwc(Device *d, Precision p, float *h, int n, int c, int hw) {
    precision_round_array(p, (int64_t)n * c * hw, h); /* h becomes the p values, in NCHW */
    float *t = to_nhwc(h, n, c, hw);
    void *dev = up_lp(d, p, t, (int64_t)n * c * hw);
    free(t);
    return dev;
}

/* Any type (fp32 too), either layout: host NCHW floats (rounded to p in place) onto the device,
 * and a device tensor back as NCHW floats. */
static void *up_typed(Device *d, Precision p, float *h, int n, int c, int hw, int nhwc) {
    const int64_t cnt = (int64_t)n * c * hw;
    if (p != PREC_FP32) return nhwc ? up_nhwc(d, p, h, n, c, hw) : up_lp(d, p, h, cnt);
    if (!nhwc) return up(d, h, cnt);
    float *t = to_nhwc(h, n, c, hw);
    void *dev = up(d, t, cnt);
    free(t);
    return dev;
}

static float *down_typed(Device *d, Precision p, const void *dev, int n, int c, int hw, int nhwc) {
    const int64_t cnt = (int64_t)n * c * hw;
    if (p != PREC_FP32) return nhwc ? down_nhwc(d, p, dev, n, c, hw) : down_lp(d, p, dev, cnt);
    float *h = hzeros(cnt);
    device_copy_d2h(d, h, dev, (size_t)cnt * sizeof(float));
    if (!nhwc) return h;
    float *x = from_nhwc(h, n, c, hw);
    free(h);
    return x;
}

/* fp32 channels-last convolution, as a channels-last fp32 model runs it: NHWC activations and the
 * KRSC weight read and written in place — backward-filter adding straight into a non-zero KRSC dw
 * (beta = 1, the model's grad_flat), backward-data overwriting and adding. The host keeps NCHW /
 * OIHW and converts at the boundary; same tolerances as the NCHW conv test. */
START_TEST(test_conv_fp32_channels_last_matches_reference) {
    if (!test_have_gpu("ops_cuda: fp32 conv on NHWC activations and KRSC weights")) return;
    Device d;
    gpu_open(&d, 0, 0);
    for (size_t ci = 0; ci < sizeof conv_cfgs / sizeof conv_cfgs[0]; ci++) {
        const ConvCfg *cf = &conv_cfgs[ci];
        Conv cv = {.prec = PREC_FP32, .channels_last = 1};
        conv_shape(&cv.s, cf->cin, cf->cout, cf->k, cf->stride, cf->pad, cf->h, cf->w);
        const int n = 4, kk = cf->k * cf->k, ihw = cf->h * cf->w, ohw = cv.s.hout * cv.s.wout;
        const int64_t nx = (int64_t)n * cf->cin * ihw, nw = (int64_t)cf->cout * cf->cin * kk, ny = (int64_t)n * cf->cout * ohw;
        float *hx = hrand(nx, 9600 + ci, -1.f, 1.f), *hw_ = hrand(nw, 9610 + ci, -0.5f, 0.5f);
        float *hdy = hrand(ny, 9620 + ci, -1.f, 1.f), *hdx0 = hrand(nx, 9630 + ci, -1.f, 1.f);
        float *hdw0 = hrand(nw, 9640 + ci, -1.f, 1.f);
        float *ry = hzeros(ny), *rdx = hzeros(nx), *rdx_acc = hcopy(hdx0, nx), *rdw = hcopy(hdw0, nw);
        ref_conv_forward_f32(&cv.s, n, hx, hw_, ry);
        ref_conv_backward_data_f32(&cv.s, n, hdy, hw_, rdx, 0);
        ref_conv_backward_data_f32(&cv.s, n, hdy, hw_, rdx_acc, 1);
        ref_conv_backward_filter_f32(&cv.s, n, hx, hdy, rdw, 1);
        float *rdw_new = hzeros(nw);
        ref_conv_backward_filter_f32(&cv.s, n, hx, hdy, rdw_new, 0);
        float *wk = hzeros(nw), *dwk = hzeros(nw);
        conv_weight_oihw_to_krsc(cf->cout, cf->cin, kk, hw_, wk);
        conv_weight_oihw_to_krsc(cf->cout, cf->cin, kk, hdw0, dwk);
        void *x = up_typed(&d, PREC_FP32, hx, n, cf->cin, ihw, 1), *dy = up_typed(&d, PREC_FP32, hdy, n, cf->cout, ohw, 1);
        void *dx = up_typed(&d, PREC_FP32, hdx0, n, cf->cin, ihw, 1), *dx_acc = up_typed(&d, PREC_FP32, hdx0, n, cf->cin, ihw, 1);
        float *w = up(&d, wk, nw), *dw = up(&d, dwk, nw), *dw_new = up(&d, dwk, nw), *y = dzeros(&d, ny);
        conv_forward(&d, &cv, n, x, w, y);
        conv_backward_data(&d, &cv, n, dy, w, dx, 0);
        conv_backward_data(&d, &cv, n, dy, w, dx_acc, 1);
        conv_backward_filter(&d, &cv, n, x, dy, dw, 1);
        conv_backward_filter(&d, &cv, n, x, dy, dw_new, 0); /* the first backward after zero_grad: = */
        float *gy = down_typed(&d, PREC_FP32, y, n, cf->cout, ohw, 1), *gdx = down_typed(&d, PREC_FP32, dx, n, cf->cin, ihw, 1);
        float *gdxa = down_typed(&d, PREC_FP32, dx_acc, n, cf->cin, ihw, 1), *gdwk = down(&d, dw, nw), *gdw = hzeros(nw);
        conv_weight_krsc_to_oihw(cf->cout, cf->cin, kk, gdwk, gdw);
        float *gdwnk = down(&d, dw_new, nw), *gdwn = hzeros(nw);
        conv_weight_krsc_to_oihw(cf->cout, cf->cin, kk, gdwnk, gdwn);
        EXPECT_CLOSE(gy, ry, ny, TOL_CONV, "conv fp32 NHWC cfg %zu forward", ci);
        EXPECT_CLOSE(gdx, rdx, nx, TOL_CONV, "conv fp32 NHWC cfg %zu backward-data", ci);
        EXPECT_CLOSE(gdxa, rdx_acc, nx, TOL_CONV, "conv fp32 NHWC cfg %zu backward-data accumulate", ci);
        EXPECT_CLOSE(gdw, rdw, nw, TOL_CONV, "conv fp32 NHWC cfg %zu backward-filter (+= into KRSC)", ci);
        EXPECT_CLOSE(gdwn, rdw_new, nw, TOL_CONV, "conv fp32 NHWC cfg %zu backward-filter (= into KRSC)", ci);
        conv_release(&d, &cv);
        free(hx), free(hw_), free(hdy), free(hdx0), free(hdw0), free(ry), free(rdx), free(rdx_acc), free(rdw);
        free(rdw_new), free(gdwnk), free(gdwn);
        free(wk), free(dwk), free(gy), free(gdx), free(gdxa), free(gdwk), free(gdw);
        device_free(&d, x), device_free(&d, dy), device_free(&d, dx), device_free(&d, dx_acc);
        device_free(&d, w), device_free(&d, dw), device_free(&d, dw_new), device_free(&d, y);
    }
    device_destroy(&d);
}
END_TEST

/* Batch norm with its ReLU fused (kernels.cu: partial statistics per chunk, a fixed-order merge,
 * an elementwise pass), fp32/fp16/bf16 × NCHW/NHWC, on shapes that cut every channel into many
 * chunks and leave part of a block idle (c = 40): against the emulation — BN, then ReLU; backward:
 * the gradient masked by the output's sign (the GPU's own output, so a value within rounding of 0
 * cannot flip the comparison), then BN's backward, overwriting dx and accumulating into another.
 * NHWC takes the 16-byte vector kernels where the vector's channels divide c (4 in fp32, 8 in 16
 * bits): c = 20 runs them in fp32 and the scalar kernels in 16 bits, c = 3 the scalar ones always.
 * 64×20×512 gives the finalize its widest shape: 256 chunks (256 lanes a channel) on the vector
 * path, 512 (two a lane) on the scalar one. The last shape's x spreads ±1e-2 (variance ~3e-5, near
 * eps = 1e-5): eps misplaced, 1/(√var + eps) instead of 1/√(var + eps), moves invstd by 15%. A
 * second forward must repeat the bits. */
START_TEST(test_bn_fused_relu_matches_emulation) {
    if (!test_have_gpu("ops_cuda: batch norm + fused ReLU, fp32/fp16/bf16, NCHW and NHWC")) return;
    Device d;
    gpu_open(&d, 0, 0);
    Precision ps[3] = {PREC_FP32};
    int np = 1 + lp_types(&d, ps + 1);
    const int shapes[7][3] = {{16, 64, 256}, {8, 40, 49}, {64, 512, 16}, {4, 20, 9}, {2, 3, 7}, {64, 20, 512},
                              {8, 40, 49}};
    for (int k = 0; k < np; k++)
        for (int si_ = 0; si_ < 7; si_++)
            for (int nhwc = 0; nhwc < 2; nhwc++) {
                const Precision p = ps[k];
                const int n = shapes[si_][0], c = shapes[si_][1], hw = shapes[si_][2];
                const int64_t cnt = (int64_t)n * c * hw;
                const double tol = p == PREC_FP32 ? TOL_SUM : TOL_LP(p);
                const float lo = si_ == 6 ? -1e-2f : -2.f, hi = si_ == 6 ? 1e-2f : 3.f;
                float *hx = hrand(cnt, 9700 + si_, lo, hi), *hdy = hrand(cnt, 9710 + si_, -1.f, 1.f);
                float *hg = hrand(c, 9720, 0.5f, 1.5f), *hb = hrand(c, 9721, -0.5f, 0.5f);
                void *x = up_typed(&d, p, hx, n, c, hw, nhwc), *dy = up_typed(&d, p, hdy, n, c, hw, nhwc);
                float *g = up(&d, hg, c), *b = up(&d, hb, c), *rm = dzeros(&d, c), *rv = dzeros(&d, c);
                float *sm = dzeros(&d, c), *sv = dzeros(&d, c), *dg = dzeros(&d, c), *db = dzeros(&d, c);
                size_t bytes = (size_t)cnt * precision_bytes(&d, p);
                void *y = device_alloc(&d, bytes, "test y"), *dx = device_alloc(&d, bytes, "test dx");
                bn_prepare(&d, nhwc, n, c, hw);
                bn_forward_train_lp(&d, p, nhwc, n, c, hw, x, g, b, rm, rv, BN_MOMENTUM, BN_EPS, sm, sv, y, 1);
                bn_backward_lp(&d, p, nhwc, n, c, hw, x, y, dy, g, sm, sv, BN_EPS, dx, dg, db, 0, 1);
                float *hdxa = hrand(cnt, 9730 + si_, -1.f, 1.f), *dga = dzeros(&d, c), *dba = dzeros(&d, c);
                void *dxa = up_typed(&d, p, hdxa, n, c, hw, nhwc); /* hdxa: rounded to p, NCHW */
                bn_backward_lp(&d, p, nhwc, n, c, hw, x, y, dy, g, sm, sv, BN_EPS, dxa, dga, dba, 1, 1);

                float *ry = hzeros(cnt), *rrm = hzeros(c), *rrv = hzeros(c), *rsm = hzeros(c), *rsv = hzeros(c);
                float *rdx = hzeros(cnt), *rdg = hzeros(c), *rdb = hzeros(c), *masked = hzeros(cnt);
                ref_bn_forward_train_lp(p, n, c, hw, hx, hg, hb, rrm, rrv, BN_MOMENTUM, BN_EPS, rsm, rsv, ry);
                ref_relu_forward_f32(cnt, ry, ry);
                float *gy = down_typed(&d, p, y, n, c, hw, nhwc), *gdx = down_typed(&d, p, dx, n, c, hw, nhwc);
                ref_relu_backward_f32(cnt, gy, hdy, masked, 0);
                ref_bn_backward_lp(p, n, c, hw, hx, masked, hg, rsm, rsv, BN_EPS, rdx, rdg, rdb, 0);
                float *rdga = hzeros(c), *rdba = hzeros(c), *gdxa = down_typed(&d, p, dxa, n, c, hw, nhwc);
                ref_bn_backward_lp(p, n, c, hw, hx, masked, hg, rsm, rsv, BN_EPS, hdxa, rdga, rdba, 1);

                char tag[96];
                snprintf(tag, sizeof tag, "bn+relu %s %s n=%d c=%d hw=%d", precision_name(p),
                         nhwc ? "NHWC" : "NCHW", n, c, hw);
                EXPECT_CLOSE(gy, ry, cnt, tol, "%s y", tag);
                EXPECT_CLOSE(gdx, rdx, cnt, tol, "%s dx", tag);
                EXPECT_GPU_CLOSE(&d, sm, rsm, c, TOL_SUM, "%s save_mean", tag);
                EXPECT_GPU_CLOSE(&d, sv, rsv, c, TOL_SUM, "%s save_invstd", tag);
                EXPECT_GPU_CLOSE(&d, rm, rrm, c, TOL_SUM, "%s running_mean", tag);
                EXPECT_GPU_CLOSE(&d, rv, rrv, c, TOL_SUM, "%s running_var", tag);
                EXPECT_GPU_CLOSE(&d, dg, rdg, c, TOL_SUM, "%s dgamma", tag);
                EXPECT_GPU_CLOSE(&d, db, rdb, c, TOL_SUM, "%s dbeta", tag);
                EXPECT_CLOSE(gdxa, hdxa, cnt, tol, "%s dx +=", tag);
                EXPECT_GPU_CLOSE(&d, dga, rdga, c, TOL_SUM, "%s dgamma (second backward)", tag);
                EXPECT_GPU_CLOSE(&d, dba, rdba, c, TOL_SUM, "%s dbeta (second backward)", tag);
                /* Every reduction order is fixed (kernels.cu): a second forward repeats the bits. */
                void *y2 = device_alloc(&d, bytes, "test y2");
                bn_forward_train_lp(&d, p, nhwc, n, c, hw, x, g, b, rm, rv, BN_MOMENTUM, BN_EPS, sm, sv, y2, 1);
                char *hy1 = malloc(bytes), *hy2 = malloc(bytes);
                device_copy_d2h(&d, hy1, y, bytes), device_copy_d2h(&d, hy2, y2, bytes);
                ck_assert_msg(memcmp(hy1, hy2, bytes) == 0, "%s: a second forward gave different bits", tag);
                free(hy1), free(hy2), device_free(&d, y2);
                free(hdxa), free(rdga), free(rdba), free(gdxa);
                device_free(&d, dxa), device_free(&d, dga), device_free(&d, dba);
                free(hx), free(hdy), free(hg), free(hb), free(ry), free(rrm), free(rrv), free(rsm);
                free(rsv), free(rdx), free(rdg), free(rdb), free(masked), free(gy), free(gdx);
                device_free(&d, x), device_free(&d, dy), device_free(&d, g), device_free(&d, b);
                device_free(&d, rm), device_free(&d, rv), device_free(&d, sm), device_free(&d, sv);
                device_free(&d, dg), device_free(&d, db), device_free(&d, y), device_free(&d, dx);
            }
    device_destroy(&d);
}
END_TEST

/* launch_scale_lp — a 16-bit mean all-reduce's contribution over NCCL when ncclAvg's rounded 1/world
 * would bias it (comm_nccl.c) — gives precision_scale_stored's bits, the host ring's rule: every
 * finite 16-bit pattern, subnormals and both zeros included, times 1/3, 1/5, 1/6, 1/7 and 1/2. */
START_TEST(test_scale_lp_matches_host) {
    if (!test_have_gpu("ops_cuda: the 16-bit mean's multiply (launch_scale_lp)")) return;
#ifdef USE_CUDA
    Device d;
    gpu_open(&d, 0, 0);
    Precision ps[2];
    int np = lp_types(&d, ps);
    enum { N = 65536 };
    uint16_t *h = malloc(N * sizeof *h), *want = malloc(N * sizeof *want), *got = malloc(N * sizeof *got);
    void *x = device_alloc(&d, N * sizeof(uint16_t), "test scale_lp");
    const float alphas[] = {1.f / 3, 1.f / 5, 1.f / 6, 1.f / 7, 0.5f};
    for (int t = 0; t < np; t++)
        for (size_t k = 0; k < sizeof alphas / sizeof alphas[0]; k++) {
            int n = 0;
            for (uint32_t b = 0; b < N; b++) { /* the finite patterns only: NaN payloads are not ours to pin */
                float v = ps[t] == PREC_FP16 ? f16_to_f32((uint16_t)b) : bf16_to_f32((uint16_t)b);
                if (isfinite(v)) h[n++] = (uint16_t)b;
            }
            memcpy(want, h, (size_t)n * sizeof *h);
            precision_scale_stored(ps[t], n, want, alphas[k]);
            device_copy_h2d(&d, x, h, (size_t)n * sizeof *h);
            launch_scale_lp(d.stream, (int)ps[t], n, x, alphas[k]);
            device_copy_d2h(&d, got, x, (size_t)n * sizeof *h);
            for (int i = 0; i < n; i++)
                ck_assert_msg(got[i] == want[i], "%s × %g: 0x%04x gives 0x%04x on the GPU, 0x%04x on the host",
                              precision_name(ps[t]), alphas[k], h[i], got[i], want[i]);
        }
    device_free(&d, x);
    free(h), free(want), free(got);
    device_destroy(&d);
#endif
}
END_TEST

/* The elementwise kernels that move 16 bytes a thread (kernels.cu) — add + ReLU both ways (forward:
 * one rounding each, as the two ops; backward: the mask, then a copy or an add into each input's
 * gradient), and the autocast casts (cast_add_clear too) — against the emulation, exactly, every
 * type, in the three ways a call can fall:
 * a count of whole vectors, a count with a rest (block 0 does it element by element), and tensors
 * one element off 16-byte alignment (the scalar kernels). */
START_TEST(test_add_relu_and_casts_exact) {
    if (!test_have_gpu("ops_cuda: add + fused ReLU and the casts, fp32/fp16/bf16, vector and scalar")) return;
    Device d;
    gpu_open(&d, 0, 0);
    Precision ps[3] = {PREC_FP32};
    int np = 1 + lp_types(&d, ps + 1);
    const int64_t counts[3] = {2960, 21, 2960}, offs[3] = {0, 0, 1};
    for (int ck = 0; ck < 3 * np; ck++) /* case ck / np, type ck % np */
        for (int acc = 0; acc < 2; acc++) {
            const int64_t cnt = counts[ck / np], off = offs[ck / np], all = cnt + off;
            const Precision p = ps[ck % np];
            const size_t esz = precision_bytes(&d, p);
            char tag[64];
            snprintf(tag, sizeof tag, "%s, %lld values at +%lld", precision_name(p), (long long)cnt, (long long)off);
            float *ha = hrand(all, 9800, -1.f, 1.f), *hb = hrand(all, 9801, -1.f, 1.f);
            float *hdy = hrand(all, 9802, -1.f, 1.f), *hda = hrand(all, 9803, -1.f, 1.f), *hdb = hrand(all, 9804, -1.f, 1.f);
            /* flat (n = c = 1): elementwise ops see no shape; +off·esz: the misaligned case */
            void *a = up_typed(&d, p, ha, 1, 1, (int)all, 0), *b = up_typed(&d, p, hb, 1, 1, (int)all, 0);
            void *dy = up_typed(&d, p, hdy, 1, 1, (int)all, 0), *da = up_typed(&d, p, hda, 1, 1, (int)all, 0);
            void *db = up_typed(&d, p, hdb, 1, 1, (int)all, 0);
            void *y = device_alloc(&d, (size_t)all * esz, "test y");
            device_memset0(&d, y, (size_t)all * esz); /* +off leaves y[0] unwritten, and it is read back */
#define AT(t) ((void *)((char *)(t) + off * esz))
            add_relu_forward_lp(&d, p, cnt, AT(a), AT(b), AT(y));
            add_relu_backward_lp(&d, p, cnt, AT(y), AT(dy), AT(da), acc, AT(db), !acc);
            float *ry = hzeros(all);
            ref_add_forward_lp(p, cnt, ha + off, hb + off, ry + off);
            ref_relu_forward_f32(cnt, ry + off, ry + off);
            ref_add_relu_backward_lp(p, cnt, ry + off, hdy + off, hda + off, acc, hdb + off, !acc);
            float *gy = down_typed(&d, p, y, 1, 1, (int)all, 0), *gda = down_typed(&d, p, da, 1, 1, (int)all, 0);
            float *gdb = down_typed(&d, p, db, 1, 1, (int)all, 0);
            for (int64_t i = off; i < all; i++) {
                ck_assert_msg(gy[i] == ry[i] && signbit(gy[i]) == signbit(ry[i]), "add+relu %s: y[%lld] %g vs %g", tag,
                              (long long)i, gy[i], ry[i]);
                ck_assert_msg(gda[i] == hda[i] && gdb[i] == hdb[i], "add+relu %s: backward element %lld", tag,
                              (long long)i);
            }
            /* the casts: fp32 → p (round to nearest even, as ref_cast_to_lp) and back */
            float *hw32 = hrand(all, 9805, -3.f, 3.f), *w32 = up(&d, hw32, all), *back = up(&d, hda, all);
            cast_to(&d, p, cnt, (float *)w32 + off, AT(y));
            cast_from(&d, p, cnt, AT(y), back + off);
            float *rw = hcopy(hw32, all), *gw = down_typed(&d, p, y, 1, 1, (int)all, 0), *gback = hzeros(all);
            ref_cast_to_lp(p, cnt, hw32 + off, rw + off);
            device_copy_d2h(&d, gback, back, (size_t)all * sizeof(float));
            for (int64_t i = off; i < all; i++) {
                ck_assert_msg(gw[i] == rw[i], "cast_to %s: element %lld %g vs %g", tag, (long long)i, gw[i], rw[i]);
                ck_assert_msg(gback[i] == rw[i], "cast_from %s: element %lld %g vs %g", tag, (long long)i, gback[i],
                              rw[i]);
            }
            /* cast_add_clear: back += y where y ≠ 0, then y = 0 (autocast's batched weight gradients) */
            if (acc) { /* some zeros to skip, onto some −0 gradients: a skipped zero keeps its sign */
                device_memset0(&d, (char *)y + off * esz, esz * (size_t)(cnt / 3));
                for (int64_t i = off; i < off + cnt / 3; i += 5) gback[i] = -0.f;
                device_copy_h2d(&d, back, gback, (size_t)all * sizeof(float));
            }
            float *gy0 = down_typed(&d, p, y, 1, 1, (int)all, 0);
            cast_add_clear(&d, p, cnt, AT(y), back + off);
            float *gy1 = down_typed(&d, p, y, 1, 1, (int)all, 0), *gback2 = hzeros(all);
            device_copy_d2h(&d, gback2, back, (size_t)all * sizeof(float));
            for (int64_t i = off; i < all; i++) {
                const float want = gy0[i] != 0.f ? gback[i] + gy0[i] : gback[i];
                ck_assert_msg(gback2[i] == want && signbit(gback2[i]) == signbit(want),
                              "cast_add_clear %s: element %lld %g vs %g", tag, (long long)i, gback2[i], want);
                ck_assert_msg(gy1[i] == 0.f, "cast_add_clear %s: source element %lld left %g", tag, (long long)i,
                              gy1[i]);
            }
            free(gy0), free(gy1), free(gback2);
#undef AT
            free(hw32), free(rw), free(gw), free(gback), device_free(&d, w32), device_free(&d, back);
            free(ha), free(hb), free(hdy), free(hda), free(hdb), free(ry), free(gy), free(gda), free(gdb);
            device_free(&d, a), device_free(&d, b), device_free(&d, dy), device_free(&d, da);
            device_free(&d, db), device_free(&d, y);
        }
    device_destroy(&d);
}
END_TEST

START_TEST(test_lp_channels_last_matches_emulation) {
    if (!test_have_gpu("ops_cuda: channels-last fp16/bf16 ops vs emulation")) return;
    Device d;
    gpu_open(&d, 0, 0);
    Precision ps[2];
    int np = lp_types(&d, ps);
    for (int k = 0; k < np; k++) {
        Precision p = ps[k];
        const char *pn = precision_name(p);
        /* the input cast (conv weights need none: the model stores them KRSC, model.h) */
        int n = 3, c = 5, hw = 7 * 6;
        float *hx = hrand((int64_t)n * c * hw, 9100, -3.f, 3.f), *rx = hzeros((int64_t)n * c * hw);
        float *x32 = up(&d, hx, (int64_t)n * c * hw);
        void *xl = device_alloc(&d, (size_t)n * c * hw * 2, "lp");
        cast_to_nhwc(&d, p, n, c, hw, x32, xl);
        ref_cast_to_lp(p, (int64_t)n * c * hw, hx, rx);
        float *gx = down_nhwc(&d, p, xl, n, c, hw);
        ck_assert_msg(!memcmp(gx, rx, (size_t)n * c * hw * 4), "cast_to_nhwc %s", pn);
        free(gx), free(hx), free(rx);
        device_free(&d, x32), device_free(&d, xl);

        /* convolution on NHWC / KRSC: the weight reordered on the host, as the model stores it */
        for (size_t ci = 0; ci < sizeof conv_cfgs / sizeof conv_cfgs[0]; ci++) {
            const ConvCfg *cf = &conv_cfgs[ci];
            Conv cv = {.prec = p, .channels_last = 1};
            conv_shape(&cv.s, cf->cin, cf->cout, cf->k, cf->stride, cf->pad, cf->h, cf->w);
            int bn = 2, K2 = cf->k * cf->k, ihw = cf->h * cf->w, ohw = cv.s.hout * cv.s.wout;
            int64_t nx = (int64_t)bn * cf->cin * ihw, nw = (int64_t)cf->cout * cf->cin * K2, ny = (int64_t)bn * cf->cout * ohw;
            float *ax = hrand(nx, 9200 + ci, -1.f, 1.f), *aw = hrand(nw, 9300 + ci, -0.5f, 0.5f), *ady = hrand(ny, 9400 + ci, -1.f, 1.f);
            void *dx_ = up_nhwc(&d, p, ax, bn, cf->cin, ihw), *ddy = up_nhwc(&d, p, ady, bn, cf->cout, ohw);
            precision_round_array(p, nw, aw);
            float *awk = hzeros(nw);
            conv_weight_oihw_to_krsc(cf->cout, cf->cin, K2, aw, awk);
            void *dw_ = up_lp(&d, p, awk, nw), *dy_ = device_alloc(&d, ny * 2, "lp");
            void *dgx = device_alloc(&d, nx * 2, "lp"), *dgw = device_alloc(&d, nw * 2, "lp");
            conv_forward_lp(&d, &cv, p, bn, dx_, dw_, dy_);
            conv_backward_data_lp(&d, &cv, p, bn, ddy, dw_, dgx, 0);
            conv_backward_filter_lp(&d, &cv, p, bn, dx_, ddy, dgw);
            float *gwk = down_lp(&d, p, dgw, nw), *gw = hzeros(nw);
            conv_weight_krsc_to_oihw(cf->cout, cf->cin, K2, gwk, gw);
            float *ry = hzeros(ny), *rgx = hzeros(nx), *rgw = hzeros(nw);
            ref_conv_forward_lp(p, &cv.s, bn, ax, aw, ry);
            ref_conv_backward_data_lp(p, &cv.s, bn, ady, aw, rgx, 0);
            ref_conv_backward_filter_lp(p, &cv.s, bn, ax, ady, rgw);
            float *gy = down_nhwc(&d, p, dy_, bn, cf->cout, ohw), *ggx = down_nhwc(&d, p, dgx, bn, cf->cin, ihw);
            EXPECT_CLOSE(gy, ry, ny, TOL_LP(p), "conv NHWC %s cfg %zu forward", pn, ci);
            EXPECT_CLOSE(ggx, rgx, nx, TOL_LP(p), "conv NHWC %s cfg %zu backward-data", pn, ci);
            EXPECT_CLOSE(gw, rgw, nw, TOL_LP(p), "conv NHWC %s cfg %zu backward-filter", pn, ci);
            conv_release(&d, &cv);
            free(ax), free(aw), free(awk), free(ady), free(ry), free(rgx), free(rgw), free(gy), free(ggx);
            free(gwk), free(gw);
            device_free(&d, dx_), device_free(&d, ddy), device_free(&d, dw_), device_free(&d, dy_);
            device_free(&d, dgx), device_free(&d, dgw);
        }

        /* batch norm and pooling on NHWC */
        int bn_ = 4, bc = 24, bhw = 49;
        int64_t cnt = (int64_t)bn_ * bc * bhw;
        float *bx = hrand(cnt, 9500, -2.f, 3.f), *bdy = hrand(cnt, 9501, -1.f, 1.f);
        float *g = hrand(bc, 9502, 0.5f, 1.5f), *b = hrand(bc, 9503, -0.5f, 0.5f);
        void *x = up_nhwc(&d, p, bx, bn_, bc, bhw), *dy = up_nhwc(&d, p, bdy, bn_, bc, bhw);
        float *dg = up(&d, g, bc), *db = up(&d, b, bc), *rm = dzeros(&d, bc), *rv = dzeros(&d, bc);
        float *sm = dzeros(&d, bc), *sv = dzeros(&d, bc), *gg = dzeros(&d, bc), *gb = dzeros(&d, bc);
        void *y = device_alloc(&d, cnt * 2, "lp"), *dx = device_alloc(&d, cnt * 2, "lp");
        float *rrm = hzeros(bc), *rrv = hzeros(bc), *rsm = hzeros(bc), *rsv = hzeros(bc), *rgg = hzeros(bc), *rgb = hzeros(bc);
        float *ry = hzeros(cnt), *rdx = hzeros(cnt);
        bn_prepare(&d, 1, bn_, bc, bhw);
        bn_forward_train_lp(&d, p, 1, bn_, bc, bhw, x, dg, db, rm, rv, BN_MOMENTUM, BN_EPS, sm, sv, y, 0);
        ref_bn_forward_train_lp(p, bn_, bc, bhw, bx, g, b, rrm, rrv, BN_MOMENTUM, BN_EPS, rsm, rsv, ry);
        bn_backward_lp(&d, p, 1, bn_, bc, bhw, x, NULL, dy, dg, sm, sv, BN_EPS, dx, gg, gb, 0, 0);
        ref_bn_backward_lp(p, bn_, bc, bhw, bx, bdy, g, rsm, rsv, BN_EPS, rdx, rgg, rgb, 0);
        float *gy = down_nhwc(&d, p, y, bn_, bc, bhw), *gdx = down_nhwc(&d, p, dx, bn_, bc, bhw);
        EXPECT_CLOSE(gy, ry, cnt, TOL_LP(p), "bn NHWC %s train y", pn);
        EXPECT_GPU_CLOSE(&d, sm, rsm, bc, TOL_SUM, "bn NHWC %s save_mean", pn);
        EXPECT_GPU_CLOSE(&d, sv, rsv, bc, TOL_SUM, "bn NHWC %s save_invstd", pn);
        EXPECT_GPU_CLOSE(&d, rv, rrv, bc, TOL_SUM, "bn NHWC %s running_var", pn);
        EXPECT_CLOSE(gdx, rdx, cnt, TOL_LP(p), "bn NHWC %s dx", pn);
        EXPECT_GPU_CLOSE(&d, gg, rgg, bc, TOL_SUM, "bn NHWC %s dgamma", pn);
        EXPECT_GPU_CLOSE(&d, gb, rgb, bc, TOL_SUM, "bn NHWC %s dbeta", pn);
        free(gy), free(gdx);
        bn_forward_eval_lp(&d, p, 1, bn_, bc, bhw, x, dg, db, rm, rv, BN_EPS, y);
        ref_bn_forward_eval_lp(p, bn_, bc, bhw, bx, g, b, rrm, rrv, BN_EPS, ry);
        gy = down_nhwc(&d, p, y, bn_, bc, bhw);
        EXPECT_CLOSE(gy, ry, cnt, TOL_LP(p), "bn NHWC %s eval y", pn);
        void *pool = device_alloc(&d, (size_t)bn_ * bc * 2, "lp");
        float *rpool = hzeros(bn_ * bc);
        avgpool_forward_lp(&d, p, 1, bn_, bc, bhw, x, pool);
        ref_avgpool_forward_lp(p, bn_, bc, bhw, bx, rpool);
        EXPECT_LP_CLOSE(&d, p, pool, rpool, bn_ * bc, TOL_LP(p), "avgpool NHWC %s forward", pn);
        avgpool_backward_lp(&d, p, 1, bn_, bc, bhw, pool, dx, 0);
        ref_avgpool_backward_lp(p, bn_, bc, bhw, rpool, rdx, 0);
        gdx = down_nhwc(&d, p, dx, bn_, bc, bhw);
        EXPECT_CLOSE(gdx, rdx, cnt, TOL_LP(p), "avgpool NHWC %s backward", pn);
        free(gy), free(gdx), free(bx), free(bdy), free(g), free(b), free(rrm), free(rrv), free(rsm), free(rsv);
        free(rgg), free(rgb), free(ry), free(rdx), free(rpool);
        device_free(&d, x), device_free(&d, dy), device_free(&d, dg), device_free(&d, db), device_free(&d, rm);
        device_free(&d, rv), device_free(&d, sm), device_free(&d, sv), device_free(&d, gg), device_free(&d, gb);
        device_free(&d, y), device_free(&d, dx), device_free(&d, pool);
    }
    device_destroy(&d);
}
END_TEST

/* The GradScaler's device side: the same scalar rules and the same skipping SGD, bit for bit. */
START_TEST(test_scaler_ops_match_reference) {
    if (!test_have_gpu("ops_cuda: GradScaler ops vs reference")) return;
    Device d;
    gpu_open(&d, 0, 0);
    int64_t n = 10000;
    float *hg = hrand(n, 8900, -1000.f, 1000.f), *rg = hcopy(hg, n);
    float *g = up(&d, hg, n);
    /* state: scale, inv_scale, found_inf; tracker; skipped */
    float hs[3] = {65536.f, 1.f / 65536.f, 0.f}, rs[3];
    int32_t htr = 0, rtr;
    int64_t hsk = 0, rsk;
    memcpy(rs, hs, sizeof hs), rtr = htr, rsk = hsk;
    float *st = up(&d, hs, 3);
    int32_t *tr = device_alloc(&d, 4, "tracker");
    int64_t *sk = device_alloc(&d, 8, "skipped");
    device_copy_h2d(&d, tr, &htr, 4), device_copy_h2d(&d, sk, &hsk, 8);
    scale_by_device(&d, n, g, st);
    ref_scale_by_device(n, rg, rs);
    EXPECT_GPU_EXACT(&d, g, rg, n, "scale_by_device");
    const char *pattern = "FFIFFNFIIF"; /* N: a NaN gradient, caught as an inf is */
    float *p = up(&d, hg, n), *rp = hcopy(hg, n), *buf = dzeros(&d, n), *rbuf = hzeros(n);
    for (int i = 0; pattern[i]; i++) {
        if (pattern[i] == 'I') {
            float inf = INFINITY;
            device_copy_h2d(&d, g + 1234, &inf, 4);
            rg[1234] = INFINITY;
        }
        if (pattern[i] == 'N') {
            float nan = NAN;
            device_copy_h2d(&d, g + 4321, &nan, 4);
            rg[4321] = NAN;
        }
        amp_unscale_check(&d, n, g, st + 1, st + 2);
        ref_amp_unscale_check(n, rg, rs + 1, rs + 2);
        EXPECT_GPU_EXACT(&d, st + 2, rs + 2, 1, "found_inf");
        ck_assert_msg((rs[2] != 0.f) == (pattern[i] != 'F'), "step %d (%c): found_inf %g", i, pattern[i], rs[2]);
        sgd_step_unless(&d, n, p, g, buf, 0.1f, 0.9f, 5e-4f, i == 0, st + 2);
        if (rs[2] == 0.f) ref_sgd_step_f32(n, rp, rg, rbuf, 0.1f, 0.9f, 5e-4f, i == 0);
        /* the update itself may differ by an ulp (nvcc contracts it into FMAs, as in the plain SGD
         * test); a wrongly taken or skipped step would be off by lr·g ≈ 100 */
        EXPECT_GPU_CLOSE(&d, p, rp, n, TOL_ELEM, "sgd_step_unless params");
        EXPECT_GPU_CLOSE(&d, buf, rbuf, n, TOL_ELEM, "sgd_step_unless momentum");
        amp_update_scale(&d, st, st + 1, tr, st + 2, sk, 2.0, 0.5, 3);
        ref_amp_update_scale(rs, rs + 1, &rtr, rs + 2, &rsk, 2.0, 0.5, 3);
        EXPECT_GPU_EXACT(&d, st, rs, 3, "scale, inv_scale, found_inf after update");
        device_copy_d2h(&d, &htr, tr, 4), device_copy_d2h(&d, &hsk, sk, 8);
        ck_assert(htr == rtr && hsk == rsk);
        /* fresh scaled gradients for the next step */
        float *ng = hrand(n, 9000 + i, -1000.f, 1000.f);
        device_copy_h2d(&d, g, ng, n * 4);
        device_sync(&d);
        memcpy(rg, ng, n * 4);
        free(ng);
    }
    /* a scale whose growth would overflow stays where it is (torch: only a finite grown scale is
     * taken), and the interval starts again */
    float big[3] = {0x1p127f, 0x1p-127f, 0.f};
    int32_t last = 2;
    memcpy(rs, big, sizeof big), rtr = last;
    device_copy_h2d(&d, st, big, sizeof big), device_copy_h2d(&d, tr, &last, 4);
    amp_update_scale(&d, st, st + 1, tr, st + 2, sk, 2.0, 0.5, 3);
    ref_amp_update_scale(rs, rs + 1, &rtr, rs + 2, &rsk, 2.0, 0.5, 3);
    ck_assert(rs[0] == 0x1p127f && rtr == 0);
    EXPECT_GPU_EXACT(&d, st, rs, 3, "scale, inv_scale, found_inf after a growth past FLT_MAX");
    device_copy_d2h(&d, &htr, tr, 4);
    ck_assert(htr == 0);
    int64_t counts[2] = {0, 0}, rc[2] = {0, 0}, *dc = device_alloc(&d, 16, "counts");
    rg[5] = 0.f, rg[7] = NAN, rg[9] = -INFINITY, rg[11] = 0.f;
    device_copy_h2d(&d, g, rg, n * 4);
    device_memset0(&d, dc, 16);
    count_zero_nonfinite(&d, n, g, dc);
    ref_count_zero_nonfinite(n, rg, rc);
    device_copy_d2h(&d, counts, dc, 16);
    ck_assert(counts[0] == rc[0] && counts[1] == rc[1] && rc[0] >= 2 && rc[1] == 2);
    device_free(&d, g), device_free(&d, st), device_free(&d, tr), device_free(&d, sk), device_free(&d, p);
    device_free(&d, buf), device_free(&d, dc);
    free(hg), free(rg), free(rp), free(rbuf);
    device_destroy(&d);
}
END_TEST

/* ---- the batch-norm scratch ------------------------------------------------------------------ */

/* launch_bn_scratch_floats sizes the one scratch every batch-norm call shares (partials, then coef,
 * then the vector path's per-channel operands). A path that writes past it does not fault —
 * cudaMalloc hands out whole pages — it silently corrupts what the arena put next. So each path
 * (NCHW, NHWC scalar, NHWC 16-byte vectors; every type) runs on a scratch of exactly that size
 * followed by a guard, which must come back untouched. The shapes include ones where the vector
 * plan cuts as many chunks as the sizing assumes, so no slack hides an overrun. */
START_TEST(test_bn_scratch_bounds) {
    if (!test_have_gpu("ops_cuda: batch norm stays inside launch_bn_scratch_floats")) return;
#ifdef USE_CUDA
    Device d;
    gpu_open(&d, 0, 0);
    Precision ps[3] = {PREC_FP32};
    int np = 1 + lp_types(&d, ps + 1);
    const int shapes[4][3] = {{4, 20, 9}, {2, 8, 3}, {8, 40, 49}, {16, 64, 256}};
    enum { GUARD = 4096 };
    float *sentinel = hzeros(GUARD);
    for (int i = 0; i < GUARD; i++) sentinel[i] = -12345.5f;
    for (int k = 0; k < np; k++)
        for (int sh = 0; sh < 4; sh++)
            for (int nhwc = 0; nhwc < 2; nhwc++) {
                const Precision p = ps[k];
                const int n = shapes[sh][0], c = shapes[sh][1], hw = shapes[sh][2];
                const int64_t cnt = (int64_t)n * c * hw;
                const size_t esz = precision_bytes(&d, p), fl = launch_bn_scratch_floats(nhwc, n, c, hw);
                float *hx = hrand(cnt, 9900 + sh, -2.f, 3.f), *hdy = hrand(cnt, 9901 + sh, -1.f, 1.f);
                float *hg = hrand(c, 9902, 0.5f, 1.5f), *hb = hrand(c, 9903, -0.5f, 0.5f);
                void *x = up_typed(&d, p, hx, n, c, hw, nhwc), *dy = up_typed(&d, p, hdy, n, c, hw, nhwc);
                void *y = device_alloc(&d, (size_t)cnt * esz, "test y"), *dx = device_alloc(&d, (size_t)cnt * esz, "test dx");
                float *g = up(&d, hg, c), *b = up(&d, hb, c), *rm = dzeros(&d, c), *rv = dzeros(&d, c);
                float *sm = dzeros(&d, c), *si = dzeros(&d, c), *dg = dzeros(&d, c), *db = dzeros(&d, c);
                float *scratch = device_alloc(&d, (fl + GUARD) * sizeof(float), "test scratch");
                device_copy_h2d(&d, scratch + fl, sentinel, GUARD * sizeof(float));
                launch_bn_forward_train_lp(d.stream, (int)p, nhwc, n, c, hw, x, g, b, rm, rv, BN_MOMENTUM, BN_EPS, sm,
                                           si, y, 1, scratch, NULL);
                launch_bn_backward_lp(d.stream, (int)p, nhwc, n, c, hw, x, y, dy, g, sm, si, dx, dg, db, 0, 1, scratch,
                                      NULL);
                float *guard = hzeros(GUARD);
                device_copy_d2h(&d, guard, scratch + fl, GUARD * sizeof(float));
                ck_assert_msg(memcmp(guard, sentinel, GUARD * sizeof(float)) == 0,
                              "batch norm %s %s n=%d c=%d hw=%d wrote past its %zu-float scratch", precision_name(p),
                              nhwc ? "NHWC" : "NCHW", n, c, hw, fl);
                free(guard), free(hx), free(hdy), free(hg), free(hb);
                device_free(&d, x), device_free(&d, dy), device_free(&d, y), device_free(&d, dx);
                device_free(&d, g), device_free(&d, b), device_free(&d, rm), device_free(&d, rv);
                device_free(&d, sm), device_free(&d, si), device_free(&d, dg), device_free(&d, db);
                device_free(&d, scratch);
            }
    free(sentinel);
    device_destroy(&d);
#endif
}
END_TEST

/* ---- memory accounting ----------------------------------------------------------------------- */

/* device.h: every allocation is accounted, rounded up to 512 bytes as PyTorch's allocator does. */
static size_t round512(size_t b) { return (b + 511) / 512 * 512; }

START_TEST(test_memory_accounted) {
    if (!test_have_gpu("ops_cuda: memory accounting")) return;
    Device d;
    gpu_open(&d, 0, 0);
    size_t cur0 = d.mem_cur;
    void *p = device_alloc(&d, 1000, "test");
    ck_assert_uint_eq(d.mem_cur, cur0 + round512(1000));
    ck_assert(d.mem_peak >= d.mem_cur);
    device_free(&d, p);
    ck_assert_uint_eq(d.mem_cur, cur0);

    /* conv planning (heuristic mode) allocates only the device's shared workspace, which stays
     * with the device after the plan is released; ops on a prepared plan allocate nothing */
    Conv c = {0};
    conv_shape(&c.s, 16, 32, 3, 1, 1, 12, 10);
    conv_prepare(&d, &c, 8);
    ck_assert_uint_eq(d.mem_cur, cur0 + (d.workspace_bytes ? round512(d.workspace_bytes) : 0));
    size_t planned = d.mem_cur;
    check_conv(&d, &c, 8, 8000, 1, "memory test conv");
    ck_assert_uint_eq(d.mem_cur, planned); /* check_conv's tensors were all freed */
    conv_release(&d, &c);
    ck_assert_uint_eq(d.mem_cur, planned);
    device_destroy(&d);
}
END_TEST

/* tests/gpu_mutants.sh plants one-line bugs in the CUDA code that this suite must catch on a GPU
 * (built where Check is, run on the GPU machine). Here, with or without a GPU: every mutant's line
 * is still in the code exactly once, so a change to one of those lines cannot quietly retire its
 * mutant. */
START_TEST(test_gpu_mutants_are_current) {
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "bash %s/tests/gpu_mutants.sh check", test_root());
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "each line found once"), "exit %d: %s", rc, out);
    free(out);
}
END_TEST

Suite *suite_ops_cuda(void) {
    Suite *s = suite_create("ops_cuda");
    TCase *tc = tcase_create("ops_cuda");
    /* CUDA context + cuDNN start-up take seconds per test (each runs in its own process) */
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_conv_matches_reference);
    tcase_add_test(tc, test_conv_without_tf32_is_fp32);
    tcase_add_test(tc, test_conv_deterministic);
    tcase_add_test(tc, test_conv_benchmark);
    tcase_add_test(tc, test_bn_matches_reference);
    tcase_add_test(tc, test_elementwise_matches_reference);
    tcase_add_test(tc, test_avgpool_matches_reference);
    tcase_add_test(tc, test_linear_matches_reference);
    tcase_add_test(tc, test_xent_matches_reference);
    tcase_add_test(tc, test_xent_nan_is_the_maximum);
    tcase_add_test(tc, test_sgd_matches_reference);
    tcase_add_test(tc, test_memory_accounted);
    tcase_add_test(tc, test_lp_elementwise_exact);
    tcase_add_test(tc, test_lp_conv_matches_emulation);
    tcase_add_test(tc, test_lp_bn_and_linear_match_emulation);
    tcase_add_test(tc, test_lp_channels_last_matches_emulation);
    tcase_add_test(tc, test_conv_fp32_channels_last_matches_reference);
    tcase_add_test(tc, test_bn_fused_relu_matches_emulation);
    tcase_add_test(tc, test_add_relu_and_casts_exact);
    tcase_add_test(tc, test_scale_lp_matches_host);
    tcase_add_test(tc, test_scaler_ops_match_reference);
    tcase_add_test(tc, test_bn_scratch_bounds);
    tcase_add_test(tc, test_gpu_mutants_are_current);
    suite_add_tcase(s, tc);
    return s;
}
