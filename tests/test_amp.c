/* test_amp.c — stage 5's mixed precision on the CPU backend: the fp16/bf16 conversions (exhaustively,
 * against the definition of round-to-nearest-even), every autocast op against the fp32 reference
 * with an argued error bound, the model under autocast, overflow and underflow being real, the
 * GradScaler's exact trajectories (against torch.amp.GradScaler: tests/fixtures/scaler.txt), a
 * forced overflow skipping exactly one step, and ./stage5 training end to end.
 *
 * Error bounds. u is the type's unit roundoff (fp16 2^-11, bf16 2^-8): rounding to nearest moves a
 * value by at most u relative. An op that is linear in each rounded operand (conv, linear, pool,
 * add) computes y = f(x̂, ŵ) with x̂ = x(1+δ), |δ| ≤ u, in fp32, then rounds y once. To first order
 * |ŷ − y| ≤ u·|y| + k·u·f(|x|, |w|), k = number of rounded operands: the inputs' errors add up
 * through the absolute values (no cancellation helps), and fp32 arithmetic adds ~1e-7, nothing at
 * this scale. So each test computes that bound with the fp32 reference on |x|, |w| and asserts the
 * ∞-norm error is below it (times 1.05), and above 0 (the rounding really happened), and that every
 * stored value is exactly representable in the type (we round exactly where the GPU stores). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "amp.h"
#include "model.h"
#include "ops.h"
#include "ops_ref.h"
#include "optim.h"
#include "precision.h"
#include "tests.h"

#define LIMIT "timeout 300 "

static Device cpu(void) {
    Device d = {0};
    device_init(&d, DEV_CPU, 0, -1);
    return d;
}

static double unit_roundoff(Precision p) { return p == PREC_FP16 ? 1.0 / 2048 : 1.0 / 256; }

/* ---- conversions: every 16-bit value, every midpoint, both neighbours of every midpoint -------- */

/* For the 16-bit pattern h (positive, finite) and the next one up: the value itself converts back
 * to h; the exact midpoint converts to whichever of the two has an even mantissa (ties to even);
 * one float ulp below the midpoint gives h, one above gives h + 1. Midpoints are exact floats (one
 * more bit than the 16-bit type has). The last fp16 midpoint, 65520, must round to inf (0x7C00 is
 * "even"), as on the GPU. Negative values by symmetry. */
static void check_all(uint16_t (*to16)(float), float (*from16)(uint16_t), uint16_t inf_bits) {
    for (uint32_t h = 0; h < inf_bits; h++) {
        float a = from16((uint16_t)h), b = from16((uint16_t)(h + 1));
        /* above the largest finite value the next one is inf: its "midpoint" is half an ulp up */
        double bd = h + 1 == inf_bits ? 2.0 * a - from16((uint16_t)(h - 1)) : (double)b;
        ck_assert_msg(to16(a) == h, "0x%04x does not round-trip", h);
        ck_assert_msg(to16(-a) == (h | 0x8000u), "-0x%04x does not round-trip", h);
        float mid = (float)(((double)a + bd) / 2);
        ck_assert(mid > a && mid < bd && (double)mid == ((double)a + bd) / 2);
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        ck_assert_msg(to16(mid) == even, "midpoint above 0x%04x: got 0x%04x", h, to16(mid));
        ck_assert_msg(to16(-mid) == (even | 0x8000u), "-midpoint above 0x%04x", h);
        ck_assert_msg(to16(nextafterf(mid, 0)) == h, "just below the midpoint above 0x%04x", h);
        ck_assert_msg(to16(nextafterf(mid, INFINITY)) == h + 1, "just above the midpoint above 0x%04x", h);
    }
    ck_assert(isinf(from16(inf_bits)) && to16(INFINITY) == inf_bits && to16(-INFINITY) == (inf_bits | 0x8000u));
    ck_assert(isnan(from16(to16(NAN))) && isnan(from16(to16(-NAN))));
    /* NaNs whose payload lies only in the bits that rounding drops: truncated, they would read as
     * ±inf (the classic bf16 bug) — they must stay NaN */
    const uint32_t nans[] = {0x7f800001u, 0xff800001u, 0x7f80ffffu, 0x7f801000u, 0xffc00000u, 0x7fffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        float f;
        memcpy(&f, &nans[i], 4);
        ck_assert_msg(isnan(from16(to16(f))), "NaN 0x%08x became 0x%04x", nans[i], to16(f));
    }
}

START_TEST(fp16_rounding_exhaustive) {
    check_all(f32_to_f16, f16_to_f32, 0x7c00);
    /* the landmarks of the lesson */
    ck_assert_float_eq(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
    ck_assert(isinf(f16_to_f32(f32_to_f16(65520.0f))));
    ck_assert(f16_to_f32(f32_to_f16(65519.99f)) == 65504.0f);
    ck_assert(f16_to_f32(f32_to_f16(0x1p-24f)) == 0x1p-24f);       /* smallest subnormal */
    ck_assert(f16_to_f32(f32_to_f16(0x1p-25f)) == 0.0f);           /* its half: tie to even 0 */
    ck_assert(f16_to_f32(f32_to_f16(0x1.000002p-25f)) == 0x1p-24f); /* just above: rounds up */
    ck_assert(f16_to_f32(f32_to_f16(1e-8f)) == 0.0f);              /* a typical small gradient */
}
END_TEST

START_TEST(bf16_rounding_exhaustive) {
    check_all(f32_to_bf16, bf16_to_f32, 0x7f80);
    ck_assert(bf16_to_f32(f32_to_bf16(1e-8f)) != 0.0f);  /* fp32's range: nothing underflows */
    ck_assert(!isinf(bf16_to_f32(f32_to_bf16(1e30f)))); /* ... or overflows */
    ck_assert(bf16_to_f32(f32_to_bf16(0x1p-133f)) == 0x1p-133f); /* fp32 subnormals are kept */
}
END_TEST

/* precision_round_array (the CPU backend's hot loop, with an integer fast path for the normal range)
 * must equal the reference conversion there and back, on random bit patterns of every exponent, and
 * on the edges of the fast paths, which random patterns almost never hit: fp16's 65520 (the first
 * value that rounds to inf — the fast path's carry would make it 65536) and the floats either side
 * of it and of 2^-14, and ±inf, which bf16's fast path must keep (not turn into NaN). */
START_TEST(round_array_equals_conversion) {
    int64_t n = 1 << 20;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint64_t st = 12345;
    for (int64_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(st >> 32);
        if (i % 4 == 1) u = (u & 0x807fffffu) | ((uint32_t)(100 + i % 50) << 23); /* fp16's exponents */
        memcpy(&x[i], &u, 4);
    }
    const float edges[] = {65520.0f, 65504.0f, 0x1.ffdffep15f, 0x1.ffe002p15f, 0x1p-14f, 0x1.fffffep-15f,
                           0x1.000002p-14f, INFINITY, FLT_MAX, 0x1.fefffep127f, 0x1.ff0000p127f};
    int64_t n_edges = (int64_t)(sizeof edges / sizeof edges[0]);
    for (int64_t k = 0; k < n_edges; k++) x[2 * k] = edges[k], x[2 * k + 1] = -edges[k];
    for (int pi = 1; pi <= 2; pi++) {
        memcpy(y, x, n * 4);
        precision_round_array((Precision)pi, n, y);
        for (int64_t i = 0; i < n; i++) {
            float want = pi == 1 ? f16_to_f32(f32_to_f16(x[i])) : bf16_to_f32(f32_to_bf16(x[i]));
            ck_assert_msg(!memcmp(&y[i], &want, 4) || (isnan(y[i]) && isnan(want)), "%s(%a): %a, want %a",
                          pi == 1 ? "fp16" : "bf16", x[i], y[i], want);
        }
    }
    free(x), free(y);
}
END_TEST

/* precision_scale_stored — the host ring's mean (x · fp32(1/world), rounded once to the stored type) —
 * against its definition written out here: the tests of the mean compute their expectation with the
 * function itself, so they cannot see it scale by the wrong factor, or not at all. */
START_TEST(scale_stored_is_one_product_rounded_once) {
    const float x[] = {1.5f, -3.0f, 0.1f, 65504.0f, 1e-3f, -7.25f, 0x1p-20f, 300.0f};
    const int n = (int)(sizeof x / sizeof x[0]);
    const float alpha = 1.0f / 3.0f;
    for (int pi = 0; pi <= 2; pi++) {
        Precision p = (Precision)pi;
        float f[8];
        uint16_t h[8];
        memcpy(f, x, sizeof f);
        if (p == PREC_FP32) {
            precision_scale_stored(p, n, f, alpha);
            for (int i = 0; i < n; i++) ck_assert_msg(f[i] == x[i] * alpha, "fp32 %g: %g", x[i], f[i]);
            continue;
        }
        precision_pack(p, n, x, h);
        precision_scale_stored(p, n, h, alpha);
        for (int i = 0; i < n; i++) {
            float stored = precision_round(p, x[i]); /* the value the 16 bits hold */
            uint16_t want = p == PREC_FP16 ? f32_to_f16(stored * alpha) : f32_to_bf16(stored * alpha);
            ck_assert_msg(h[i] == want, "%s %g · 1/3: 0x%04x, want 0x%04x", precision_name(p), x[i], h[i], want);
        }
    }
}
END_TEST

/* ---- each autocast op against fp32 ------------------------------------------------------------ */

static float *rnd(int64_t n, uint64_t seed, float lo, float hi) {
    float *p = malloc((size_t)n * sizeof(float));
    test_fill_uniform(p, n, seed, lo, hi);
    return p;
}

static float *dup_round(Precision p, const float *x, int64_t n) {
    float *y = malloc((size_t)n * sizeof(float));
    ref_cast_to_lp(p, n, x, y);
    return y;
}

static float *absdup(const float *x, int64_t n) {
    float *y = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) y[i] = fabsf(x[i]);
    return y;
}

static double maxabs(const float *x, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = test_max_nan(m, fabs(x[i]));
    return m;
}

static double maxdiff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = test_max_nan(m, fabs((double)a[i] - b[i]));
    return m;
}

static int representable(Precision p, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (precision_round(p, x[i]) != x[i]) return 0;
    return 1;
}

/* got (the autocast op's output) against want (fp32 op on unrounded inputs) and the first-order
 * bound u·|y| + k·u·|f|(|inputs|) (absf). */
static void check_bound(const char *op, Precision p, const float *got, const float *want, const float *absf,
                        int k, int64_t n) {
    double u = unit_roundoff(p), err = maxdiff(got, want, n);
    double bound = 1.05 * u * (maxabs(want, n) + k * maxabs(absf, n));
    ck_assert_msg(representable(p, got, n), "%s %s: an output is not a %s value", op, precision_name(p),
                  precision_name(p));
    ck_assert_msg(err <= bound, "%s %s: error %.3g above the rounding bound %.3g", op, precision_name(p), err,
                  bound);
    ck_assert_msg(err > 0, "%s %s: no rounding error at all — was anything rounded?", op, precision_name(p));
}

START_TEST(conv_and_linear_within_rounding_bound) {
    for (int pi = 1; pi <= 2; pi++) {
        Precision p = (Precision)pi;
        ConvShape s;
        conv_shape(&s, 8, 6, 3, 2, 1, 9, 9);
        int n = 3;
        int64_t nx = (int64_t)n * 8 * 81, nw = 6 * 8 * 9, ny = (int64_t)n * 6 * s.hout * s.wout;
        float *x = rnd(nx, 1, -2, 2), *w = rnd(nw, 2, -1, 1), *dy = rnd(ny, 3, -1, 1);
        float *xl = dup_round(p, x, nx), *wl = dup_round(p, w, nw), *dyl = dup_round(p, dy, ny);
        float *ax = absdup(x, nx), *aw = absdup(w, nw), *ady = absdup(dy, ny);
        float *y = calloc(ny, 4), *yl = calloc(ny, 4), *ya = calloc(ny, 4);
        ref_conv_forward_f32(&s, n, x, w, y);
        ref_conv_forward_lp(p, &s, n, xl, wl, yl);
        ref_conv_forward_f32(&s, n, ax, aw, ya);
        check_bound("conv forward", p, yl, y, ya, 2, ny);
        float *dx = calloc(nx, 4), *dxl = calloc(nx, 4), *dxa = calloc(nx, 4);
        ref_conv_backward_data_f32(&s, n, dy, w, dx, 0);
        ref_conv_backward_data_lp(p, &s, n, dyl, wl, dxl, 0);
        ref_conv_backward_data_f32(&s, n, ady, aw, dxa, 0);
        check_bound("conv backward-data", p, dxl, dx, dxa, 2, nx);
        float *dw = calloc(nw, 4), *dwl = malloc(nw * 4), *dwa = calloc(nw, 4);
        for (int64_t i = 0; i < nw; i++) dwl[i] = 1e9f; /* must be overwritten, not accumulated */
        ref_conv_backward_filter_f32(&s, n, x, dy, dw, 0);
        ref_conv_backward_filter_lp(p, &s, n, xl, dyl, dwl);
        ref_conv_backward_filter_f32(&s, n, ax, ady, dwa, 0);
        check_bound("conv backward-filter", p, dwl, dw, dwa, 2, nw);

        int in = 40, out = 7, m = 5;
        float *lx = rnd(m * in, 4, -1, 1), *W = rnd(out * in, 5, -0.5f, 0.5f), *b = rnd(out, 6, -1, 1);
        float *ldy = rnd(m * out, 7, -1, 1);
        float *lxl = dup_round(p, lx, m * in), *Wl = dup_round(p, W, out * in), *bl = dup_round(p, b, out);
        float *ldyl = dup_round(p, ldy, m * out);
        float *alx = absdup(lx, m * in), *aW = absdup(W, out * in), *ab = absdup(b, out), *aldy = absdup(ldy, m * out);
        float ly[35], lyl[35], lya[35];
        ref_linear_forward_f32(m, in, out, lx, W, b, ly);
        ref_linear_forward_lp(p, m, in, out, lxl, Wl, bl, lyl);
        ref_linear_forward_f32(m, in, out, alx, aW, ab, lya);
        check_bound("linear forward", p, lyl, ly, lya, 2, m * out);
        float *ldx = calloc(m * in, 4), *ldxl = calloc(m * in, 4), *ldxa = calloc(m * in, 4);
        /* the p gradients are fresh: what dWl and dbl held before (here 5 … 9) must not show */
        float *dW = calloc(out * in, 4), *dWl = rnd(out * in, 8, 5, 9), *dWa = calloc(out * in, 4);
        float db[7] = {0}, dbl[7] = {5, 6, 7, 8, 9, 5, 6}, dba[7] = {0};
        ref_linear_backward_f32(m, in, out, lx, W, ldy, ldx, dW, db, 0);
        ref_linear_backward_lp(p, m, in, out, lxl, Wl, ldyl, ldxl, dWl, dbl, 0);
        ref_linear_backward_f32(m, in, out, alx, aW, aldy, ldxa, dWa, dba, 0);
        check_bound("linear backward dx", p, ldxl, ldx, ldxa, 2, m * in);
        check_bound("linear backward dW", p, dWl, dW, dWa, 2, out * in);
        check_bound("linear backward db", p, dbl, db, dba, 1, out);
        free(x), free(w), free(dy), free(xl), free(wl), free(dyl), free(ax), free(aw), free(ady);
        free(y), free(yl), free(ya), free(dx), free(dxl), free(dxa), free(dw), free(dwl), free(dwa);
        free(lx), free(W), free(b), free(ldy), free(lxl), free(Wl), free(bl), free(ldyl), free(alx), free(aW);
        free(ab), free(aldy), free(ldx), free(ldxl), free(ldxa), free(dW), free(dWl), free(dWa);
    }
}
END_TEST

START_TEST(elementwise_and_pool_within_rounding_bound) {
    for (int pi = 1; pi <= 2; pi++) {
        Precision p = (Precision)pi;
        int64_t n = 4000;
        float *a = rnd(n, 11, -3, 3), *b = rnd(n, 12, -3, 3);
        float *al = dup_round(p, a, n), *bl = dup_round(p, b, n), *aa = absdup(a, n), *ba = absdup(b, n);
        float *y = malloc(n * 4), *yl = malloc(n * 4), *ya = malloc(n * 4);
        /* cast: one rounding, k = 0 */
        ref_cast_to_lp(p, n, a, yl);
        check_bound("cast", p, yl, a, a, 0, n);
        /* add: two rounded operands and the rounded sum */
        ref_add_forward_f32(n, a, b, y);
        ref_add_forward_lp(p, n, al, bl, yl);
        ref_add_forward_f32(n, aa, ba, ya);
        check_bound("add", p, yl, y, ya, 1, n);
        /* accumulate into a p tensor: round(old + new), the same bound */
        memcpy(yl, al, n * 4);
        ref_grad_pass_lp(p, n, bl, yl, 1);
        check_bound("grad accumulate", p, yl, y, ya, 1, n);
        /* relu: exact on p values */
        ref_relu_forward_f32(n, al, yl);
        ck_assert(representable(p, yl, n));
        /* pool: mean of 25 rounded values, rounded */
        int pn = 8, pc = 20, hw = 25;
        ref_avgpool_forward_f32(pn, pc, hw, a, y);
        ref_avgpool_forward_lp(p, pn, pc, hw, al, yl);
        ref_avgpool_forward_f32(pn, pc, hw, aa, ya);
        check_bound("avgpool", p, yl, y, ya, 1, pn * pc);
        ref_avgpool_backward_f32(pn, pc, hw, a, y, 0);
        ref_avgpool_backward_lp(p, pn, pc, hw, al, yl, 0);
        ref_avgpool_backward_f32(pn, pc, hw, aa, ya, 0);
        check_bound("avgpool backward", p, yl, y, ya, 1, (int64_t)pn * pc * hw);
        free(a), free(b), free(al), free(bl), free(aa), free(ba), free(y), free(yl), free(ya);
    }
}
END_TEST

/* cast_add_clear (autocast's batched weight gradients into the fp32 gradient buffer): dst += src
 * wherever src ≠ 0 — an addition, since under --accum-steps the buffer already holds the earlier
 * micro-batches' sum — a zero of either sign leaves dst's bits alone (−0 stays −0), and src is
 * cleared for the next backward. Worked by hand. */
START_TEST(cast_add_clear_adds_into_the_fp32_gradients) {
    float dst[5] = {1.0f, -0.0f, 2.0f, 3.0f, -0.5f}, src[5] = {0.5f, 0.0f, -0.0f, -1.0f, 0.25f};
    ref_cast_add_clear_lp(5, src, dst);
    const float want[5] = {1.5f, -0.0f, 2.0f, 2.0f, -0.25f};
    for (int i = 0; i < 5; i++) {
        ck_assert_msg(dst[i] == want[i] && signbit(dst[i]) == signbit(want[i]), "element %d: %g, want %g", i,
                      (double)dst[i], (double)want[i]);
        ck_assert_msg(src[i] == 0.0f, "source element %d left %g", i, (double)src[i]);
    }
}
END_TEST

/* count_zero_nonfinite (ops.h) adds to its counters, as the CUDA kernel's atomics do: two calls into
 * one pair count both arrays' zeros (either sign) and non-finite values (inf, −inf, NaN); a finite
 * value, however large or small, is neither. Counted by hand. */
START_TEST(count_zero_nonfinite_adds_to_its_counters) {
    const float a[6] = {0.0f, -0.0f, 1.0f, INFINITY, NAN, FLT_MAX}, b[4] = {-INFINITY, 0.0f, 1e-45f, -2.0f};
    int64_t counts[2] = {0, 0};
    ref_count_zero_nonfinite(6, a, counts);
    ck_assert_msg(counts[0] == 2 && counts[1] == 2, "first array: %lld zeros, %lld non-finite; want 2, 2",
                  (long long)counts[0], (long long)counts[1]);
    ref_count_zero_nonfinite(4, b, counts);
    ck_assert_msg(counts[0] == 3 && counts[1] == 3, "both arrays: %lld zeros, %lld non-finite; want 3, 3",
                  (long long)counts[0], (long long)counts[1]);
}
END_TEST

/* The end of a residual block's backward (add_relu_backward_lp): ReLU's mask on dy, then one copy
 * of it into each branch — each under its own accumulate flag (the model passes the layer's acc_in and
 * acc_in2; in ResNet-18 both are 0, so no training run tells them apart). In fp32, by hand: y > 0 passes dy
 * (y = 0 does not), a adds onto what it held, b is overwritten — and then the other way round. */
START_TEST(add_relu_backward_each_branch_its_own_accumulate) {
    const float y[4] = {1.0f, 0.0f, -1.0f, 2.0f}, dy[4] = {0.5f, 3.0f, 7.0f, -1.0f};
    for (int a_acc = 0; a_acc <= 1; a_acc++) {
        float da[4] = {10, 20, 30, 40}, db[4] = {10, 20, 30, 40};
        ref_add_relu_backward_lp(PREC_FP32, 4, y, dy, da, a_acc, db, !a_acc);
        const float fresh[4] = {0.5f, 0, 0, -1.0f}, added[4] = {10.5f, 20, 30, 39.0f};
        const float *want_a = a_acc ? added : fresh, *want_b = a_acc ? fresh : added;
        for (int i = 0; i < 4; i++)
            ck_assert_msg(da[i] == want_a[i] && db[i] == want_b[i], "acc_a %d, acc_b %d, element %d: da %g db %g, want %g %g",
                          a_acc, !a_acc, i, (double)da[i], (double)db[i], (double)want_a[i], (double)want_b[i]);
    }
}
END_TEST

/* Batch norm is not linear in x, so no |·| bound: y = γ(x − μ)/σ + β. A relative error u in each x
 * moves y by ≤ u·|γ|·|x|/σ directly and through μ (≤ u·max|x|) by as much again, σ by a relative
 * ≤ u·max|x|/σ; then y is rounded (u·|y|). With these inputs (x in [−2, 3], σ ≈ 1.4, |γ| ≤ 1.5,
 * |β| ≤ 0.5), the sum is ≤ ~8u of max|y|: tolerance 8u. Backward: dx = γ/σ·(dy − mean(dy) −
 * x̂·mean(dy·x̂)) with dy and x rounded: each of the three terms carries ≤ 2u, times |γ|/σ, plus
 * the output rounding: tolerance 12u of max|dx|. dγ, dβ are fp32 sums of n·hw rounded products:
 * ≤ 2u of Σ|dy·x̂| and u of Σ|dy|, relative to the sums themselves at most ~4u here. The running
 * statistics and saved statistics are fp32 moments of rounded x: ≤ 2u relative. */
START_TEST(batch_norm_within_bound) {
    for (int pi = 1; pi <= 2; pi++) {
        Precision p = (Precision)pi;
        double u = unit_roundoff(p);
        int n = 4, c = 3, hw = 30;
        int64_t N = (int64_t)n * c * hw;
        float *x = rnd(N, 21, -2, 3), *dy = rnd(N, 22, -1, 1), *g = rnd(c, 23, 0.5f, 1.5f), *be = rnd(c, 24, -0.5f, 0.5f);
        float *xl = dup_round(p, x, N), *dyl = dup_round(p, dy, N);
        float rm[3] = {0}, rv[3] = {1, 1, 1}, rml[3] = {0}, rvl[3] = {1, 1, 1}, sm[3], si[3], sml[3], sil[3];
        float *y = malloc(N * 4), *yl = malloc(N * 4), *dx = malloc(N * 4), *dxl = malloc(N * 4);
        ref_bn_forward_train_f32(n, c, hw, x, g, be, rm, rv, 0.1f, 1e-5f, sm, si, y);
        ref_bn_forward_train_lp(p, n, c, hw, xl, g, be, rml, rvl, 0.1f, 1e-5f, sml, sil, yl);
        ck_assert(representable(p, yl, N));
        ck_assert_msg(maxdiff(yl, y, N) <= 8 * u * maxabs(y, N), "bn forward %s", precision_name(p));
        for (int i = 0; i < c; i++) {
            ck_assert(fabs(sil[i] - si[i]) <= 2 * u * si[i] && fabs(rvl[i] - rv[i]) <= 2 * u * rv[i]);
            ck_assert(fabs(sml[i] - sm[i]) <= 2 * u * maxabs(x, N));
        }
        float dg[3] = {0}, db[3] = {0}, dgl[3] = {0}, dbl[3] = {0};
        ref_bn_backward_f32(n, c, hw, x, dy, g, sm, si, 1e-5f, dx, dg, db, 0);
        ref_bn_backward_lp(p, n, c, hw, xl, dyl, g, sml, sil, 1e-5f, dxl, dgl, dbl, 0);
        ck_assert(representable(p, dxl, N));
        ck_assert_msg(maxdiff(dxl, dx, N) <= 12 * u * maxabs(dx, N), "bn backward %s: %.3g vs %.3g",
                      precision_name(p), maxdiff(dxl, dx, N), 12 * u * maxabs(dx, N));
        ck_assert(maxdiff(dgl, dg, 3) <= 4 * u * maxabs(dg, 3) && maxdiff(dbl, db, 3) <= 4 * u * maxabs(db, 3));
        float *ye = malloc(N * 4);
        ref_bn_forward_eval_lp(p, n, c, hw, xl, g, be, rml, rvl, 1e-5f, ye);
        ck_assert(representable(p, ye, N));
        free(x), free(dy), free(g), free(be), free(xl), free(dyl), free(y), free(yl), free(dx), free(dxl), free(ye);
    }
}
END_TEST

/* ---- overflow and underflow are real in the emulation ---------------------------------------- */

START_TEST(fp16_overflows_and_underflows_bf16_does_not) {
    Device d = cpu();
    float big[2] = {70000.0f, -1e5f}, small[2] = {1e-8f, -3e-9f}, out[2];
    cast_to(&d, PREC_FP16, 2, big, out);
    ck_assert(isinf(out[0]) && out[0] > 0 && isinf(out[1]) && out[1] < 0);
    cast_to(&d, PREC_BF16, 2, big, out);
    ck_assert(isfinite(out[0]) && isfinite(out[1]));
    cast_to(&d, PREC_FP16, 2, small, out);
    ck_assert(out[0] == 0.0f && out[1] == 0.0f); /* the gradients the scaler exists for */
    /* scaled by 2^16 first (scaler.scale), they survive, and unscaling in fp32 restores them */
    float scaled[2] = {small[0] * 65536.0f, small[1] * 65536.0f};
    cast_to(&d, PREC_FP16, 2, scaled, out);
    ck_assert(out[0] != 0.0f && fabsf(out[0] / 65536.0f - small[0]) < 1e-3f * small[0]);
    /* a conv whose fp32 output exceeds 65504 stores inf in fp16 */
    ConvShape s;
    conv_shape(&s, 4, 1, 1, 1, 0, 1, 1);
    float x[4] = {200, 200, 200, 200}, w[4] = {100, 100, 100, 100}, y;
    ref_conv_forward_lp(PREC_FP16, &s, 1, x, w, &y);
    ck_assert(isinf(y));
    ref_conv_forward_lp(PREC_BF16, &s, 1, x, w, &y);
    ck_assert(y == 79872.0f); /* 80000 to bf16's 8 significant bits: finite, just coarse */
    device_destroy(&d);
}
END_TEST

/* ---- the model under autocast ----------------------------------------------------------------- */

/* The tiny ResNet in fp16 and bf16 against fp32 on the same weights and batch. After ~12 layers of
 * rounding the logits stay within a few u (norm-wise, relative to the logits' norm; measured 0.8u
 * fp16, ~1u bf16; allowed 8u). The gradients are another matter: batch norm's backward
 * dx = γ/σ·(dy − mean(dy) − x̂·mean(dy·x̂)) cancels most of dy (after global pooling dy is nearly
 * constant over each image's positions), so the relative error grows layer by layer from ~1u at
 * the linear layer to ~90u (fp16) / ~30u (bf16) at the first conv, here with a batch of 6. That is
 * the computation's conditioning, not ours: torch's own bf16 autocast gradients differ from fp32
 * by the same order (16u on the fixture of test_fixtures.c, where ours match torch's 7× better
 * than fp32 does). Measured overall 55u (fp16, with the loss scaled by 2^16 as the GradScaler
 * does), 18u (bf16); allowed 150u — a wrong rounding point or a dropped accumulation is O(1).
 * Also: the BN buffers stay fp32 (not representable in the low type). */
static double rel2(const float *a, const float *b, int64_t n) {
    double num = 0, den = 1e-300;
    for (int64_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / den);
}

START_TEST(model_under_autocast_tracks_fp32) {
    Device d = cpu();
    int n = 6;
    float *x = rnd((int64_t)n * 3072, 31, -2, 2);
    int32_t y[6] = {1, 3, 5, 7, 9, 0};
    Model *ref = model_create(&d, "tiny", 1, n, 5);
    float loss, lref;
    int32_t correct;
    model_forward(ref, n, x, 1);
    xent_forward_backward(&d, n, 10, model_logits(ref), y, 1.0f / n, &lref, &correct, model_dlogits(ref));
    model_backward(ref, n, NULL, NULL);
    for (int pi = 1; pi <= 2; pi++) {
        Precision p = (Precision)pi;
        double u = unit_roundoff(p);
        Model *m = model_create_mixed(&d, "tiny", 1, n, 5, p, 0);
        ck_assert(!memcmp(m->param_flat, ref->param_flat, m->n_param_floats * 4)); /* same init */
        float S = p == PREC_FP16 ? 65536.0f : 1.0f;
        model_forward(m, n, x, 1);
        double el = rel2(model_logits(m), model_logits(ref), n * 10);
        xent_forward_backward(&d, n, 10, model_logits(m), y, 1.0f / n, &loss, &correct, model_dlogits(m));
        scale_inplace(&d, n * 10, model_dlogits(m), S);              /* scaler.scale(loss) */
        model_backward(m, n, NULL, NULL);
        scale_inplace(&d, m->n_param_floats, m->grad_flat, 1.0f / S); /* unscale_ */
        double eg = rel2(m->grad_flat, ref->grad_flat, m->n_param_floats);
        printf("autocast %s vs fp32: logits %.2e (%.1fu), loss %.2e, gradients %.2e (%.1fu)\n", precision_name(p),
               el, el / u, fabs(loss - lref) / lref, eg, eg / u);
        ck_assert_msg(el < 8 * u && el > 0, "logits %s: %.3g", precision_name(p), el);
        ck_assert_msg(eg < 150 * u && eg > 0, "gradients %s: %.3g", precision_name(p), eg);
        ck_assert(representable(p, model_logits(m), n * 10));     /* the linear layer's p output */
        ck_assert(!representable(p, m->buffer_flat, m->n_buffer_floats)); /* fp32 running stats */
        model_destroy(m);
    }
    model_destroy(ref);
    free(x);
    device_destroy(&d);
}
END_TEST

/* ---- the GradScaler --------------------------------------------------------------------------- */

/* Every trajectory of tests/fixtures/scaler.txt (a real torch.amp.GradScaler) through ./stage5
 * --show-scaler: the printed scales must be torch's, digit for digit (%.9g round-trips a float). */
START_TEST(show_scaler_matches_torch) {
    char path[512], line[1024], cmd[1400];
    snprintf(path, sizeof path, "%s/tests/fixtures/scaler.txt", test_root());
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "%s missing: python3 tests/torch/scaler_fixture.py > %s", path, path);
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char *colon = strchr(line, ':');
        ck_assert(colon);
        *colon = 0;
        char pattern[256];
        int interval;
        double init, growth, backoff;
        ck_assert_int_eq(sscanf(line, "%255s %d %lf %lf %lf", pattern, &interval, &init, &growth, &backoff), 5);
        char *want = colon + 1;
        while (*want == ' ') want++;
        want[strcspn(want, "\n")] = 0;
        snprintf(cmd, sizeof cmd, "%s/stage5 --show-scaler %s --growth-interval %d --init-scale %.17g "
                 "--growth-factor %.17g --backoff-factor %.17g", test_root(), pattern, interval, init, growth, backoff);
        char *out;
        ck_assert_int_eq(test_run(cmd, &out), 0);
        out[strcspn(out, "\n")] = 0;
        ck_assert_msg(!strcmp(out, want), "%s\n  ours:  %s\n  torch: %s", cmd, out, want);
        free(out);
        cases++;
    }
    fclose(f);
    ck_assert_int_ge(cases, 10);
}
END_TEST

/* With no knob given, the scaler is torch.amp.GradScaler()'s: init_scale 2^16, backoff_factor 0.5,
 * growth_factor 2, growth_interval 2000 — an inf halves 65536 to 32768, and only the 2000th finite
 * step after it doubles the scale back. */
START_TEST(show_scaler_defaults_are_torchs) {
    enum { FINITE = 2000 };
    static char cmd[FINITE + 512];
    int at = snprintf(cmd, sizeof cmd, "%s/stage5 --show-scaler I", test_root());
    memset(cmd + at, 'F', FINITE);
    cmd[at + FINITE] = 0;
    char *out;
    ck_assert_int_eq(test_run(cmd, &out), 0);
    int n = 0;
    for (char *tok = strtok(out, " \n"); tok; tok = strtok(NULL, " \n"), n++) {
        double want = n < FINITE ? 32768 : 65536; /* token n: the scale after update n + 1 */
        ck_assert_msg(strtod(tok, NULL) == want, "after update %d: scale %s, torch's defaults give %g", n + 1, tok,
                      want);
    }
    ck_assert_int_eq(n, FINITE + 1);
    free(out);
}
END_TEST

/* At the top of fp32: torch takes init_scale=FLT_MAX, and a growth that would overflow to inf is not
 * taken (its update keeps the scale unless scale · growth_factor is finite); a backoff halves it, and
 * the next growth reaches FLT_MAX again. One above FLT_MAX is refused, naming the range. */
START_TEST(show_scaler_at_the_top_of_fp32) {
    char cmd[600], *out;
    snprintf(cmd, sizeof cmd, "%s/stage5 --show-scaler FFIF --growth-interval 1 --init-scale %.9g", test_root(), FLT_MAX);
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(!strcmp(out, "3.40282347e+38 3.40282347e+38 1.70141173e+38 3.40282347e+38\n"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s/stage5 --show-scaler F --init-scale 3.5e38", test_root());
    ck_assert_int_eq(test_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--init-scale must be a number in (0, 3.40282e+38]"), "%s", out);
    free(out);
}
END_TEST

/* Below 1/FLT_MAX (about 3e-39) our scaler counts a finite step as an overflow (docs/semantics.md: an
 * inf 1/scale), where torch's checks only the scaled gradient and grows the scale: 4e-39 backs off to
 * 2e-39 on the I, then torch doubles it on each F (4e-39, 8e-39) while ours keeps halving. The lesson
 * prints our trajectory and must say where it leaves torch's; a pattern that never gets there (the
 * fixture's IIIII from 1e-40: I steps back off in both) says nothing. */
START_TEST(show_scaler_says_where_it_leaves_torch) {
    char cmd[600], *out;
    snprintf(cmd, sizeof cmd, "%s/stage5 --show-scaler IFF --init-scale 4e-39 --growth-interval 1", test_root());
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(!strncmp(out, "2.00000043e-39 1.00000022e-39 5.00000108e-40\n", 45), "%s", out);
    ck_assert_msg(strstr(out, "note: step 2 (F) comes at scale 2.00000043e-39"), "%s", out);
    ck_assert_msg(strstr(out, "torch's GradScaler counts it a finite step"), "%s", out);
    free(out);
    /* …nor one that reaches a scale of 0 first (torch's stays 0 too: 0 · growth is 0) */
    const char *same[] = {"IIIII --init-scale 1e-40 --growth-interval 10", "IFF --init-scale 1e-45 --growth-interval 1"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s/stage5 --show-scaler %s", test_root(), same[i]);
        ck_assert_int_eq(test_run(cmd, &out), 0);
        ck_assert_msg(!strstr(out, "note"), "%s: %s", same[i], out);
        free(out);
    }
}
END_TEST

/* The scaler's rules directly: growth after exactly growth_interval finite steps, backoff and a
 * reset counter on an inf, the skipped step writing nothing (parameters AND momentum), unscaling
 * by the float of the double reciprocal, and the step after a skip proceeding normally: every step
 * taken is, bit for bit, plain SGD's (optim_step) on the unscaled gradients — momentum included
 * from the second step on. */
START_TEST(scaler_skips_and_scales) {
    Device d = cpu();
    AmpConfig a;
    amp_defaults(&a, "fp16");
    a.init_scale = 1024, a.growth_interval = 3;
    GradScaler s;
    scaler_init(&s, &d, &a, PREC_FP16, NULL);
    ck_assert(s.enabled);
    Optimizer o;
    optim_init(&o, &d, 4, 0.1, 0.9, 0.0);
    Optimizer plain; /* the same SGD, stepped only where the scaler lets a step through */
    optim_init(&plain, &d, 4, 0.1, 0.9, 0.0);
    float p[4] = {1, 2, 3, 4}, g[4], before[4], mom[4], p_plain[4] = {1, 2, 3, 4};
    /* N: a NaN gradient (0·inf in fp16, say) must be caught as an inf is: !isfinite, not isinf */
    float want_scale[] = {1024, 1024, 2048, 1024, 1024, 512, 512, 512, 1024};
    const char *pattern = "FFFIFNFFF";
    for (int step = 0; pattern[step]; step++) {
        for (int i = 0; i < 4; i++) g[i] = 1024.0f * (i + 1); /* = scale · (1, 2, 3, 4) at scale 1024 */
        float scale_now = scaler_get_scale(&s);
        for (int i = 0; i < 4; i++) g[i] = scale_now * (float)(i + 1);
        if (pattern[step] == 'I') g[2] = INFINITY;
        if (pattern[step] == 'N') g[1] = NAN;
        memcpy(before, p, sizeof p);
        memcpy(mom, o.momentum_buf, sizeof mom);
        scaler_step(&s, &o, p, g, 4, 0.1);
        if (pattern[step] != 'F') {
            ck_assert(!memcmp(p, before, sizeof p));                /* skipped: nothing written */
            ck_assert(!memcmp(o.momentum_buf, mom, sizeof mom));
        } else {
            ck_assert(g[0] == 1.0f && g[3] == 4.0f); /* unscaled in place */
            ck_assert(memcmp(p, before, sizeof p));
            float g_plain[4] = {1, 2, 3, 4};
            optim_step(&plain, p_plain, g_plain, 0.1);
            ck_assert_msg(!memcmp(p, p_plain, sizeof p), "step %d: parameter 0 is %.9g, plain SGD's %.9g", step,
                          (double)p[0], (double)p_plain[0]);
        }
        scaler_update(&s);
        ck_assert_msg(scaler_get_scale(&s) == want_scale[step], "step %d: scale %g, want %g", step,
                      scaler_get_scale(&s), want_scale[step]);
    }
    ck_assert_int_eq(scaler_skipped(&s), 2);
    /* 1/3 in double, rounded to float (unscale_'s reciprocal) */
    float three = 3.0f, inv;
    device_copy_h2d(&d, s.scale, &three, 4);
    ref_amp_update_scale(s.scale, s.inv_scale, s.growth_tracker, s.found_inf, s.skipped, 2, 0.5, 1000);
    memcpy(&inv, s.inv_scale, 4);
    ck_assert(inv == (float)(1.0 / 3.0));
    /* a backoff factor that is no power of two: scale · factor in double, then rounded to float, as
     * torch's CPU kernel computes float · double — from 3 by 0.9 that is 2.70000005, where a product
     * in float would give 2.69999981 (the fixture's backoffs, 0.5 and 0.25, are exact either way) */
    float inf_found = 1.0f, backed;
    device_copy_h2d(&d, s.scale, &three, 4);
    device_copy_h2d(&d, s.found_inf, &inf_found, 4);
    ref_amp_update_scale(s.scale, s.inv_scale, s.growth_tracker, s.found_inf, s.skipped, 2, 0.9, 1000);
    memcpy(&backed, s.scale, 4);
    ck_assert(3.0f * (float)0.9 != (float)(3.0 * 0.9)); /* the case tells the two apart */
    ck_assert_msg(backed == (float)(3.0 * 0.9), "3 backed off by 0.9: %.9g, want %.9g", (double)backed, 3.0 * 0.9);
    /* A scale backed off below 1/FLT_MAX: 1/scale is inf, and finite gradients unscaled by it would
     * be inf/NaN with no flag raised (torch's kernel checks only the scaled values). Ours flags it. */
    float tiny = 1e-39f, found = 0, gg[2] = {0.0f, 1.0f};
    device_copy_h2d(&d, s.scale, &tiny, 4);
    ref_amp_update_scale(s.scale, s.inv_scale, s.growth_tracker, s.found_inf, s.skipped, 2, 0.5, 1000);
    memcpy(&inv, s.inv_scale, 4);
    ck_assert(isinf(inv));
    ref_amp_unscale_check(2, gg, s.inv_scale, &found);
    ck_assert_msg(found == 1.0f, "an inf 1/scale must skip the step");
    optim_destroy(&plain);
    optim_destroy(&o);
    scaler_destroy(&s);
    device_destroy(&d);
}
END_TEST

/* The outside oracle for a skipped SGD step: torch.optim.SGD (momentum 0.9, weight decay 5e-4)
 * stepped by torch.amp.GradScaler on a GPU along a pattern whose first attempt overflows
 * (tests/torch/sgd_scaler_fixture.py). With the default foreach SGD the scaler keeps its contract on
 * the host: a skipped step does not call step(), so nothing moves and the momentum buffer is born at
 * the first step taken. Ours skips on the device, from a zeroed buffer: 0.9 · 0 + g is that birth,
 * so parameters, buffer and scale must follow torch's after every attempt. (Measured relative to the
 * largest value, as the Adam oracle is: torch's CUDA kernels round their own way.) */
START_TEST(sgd_under_the_scaler_matches_torch) {
    enum { N = 1003, STEPS = 6 }; /* the fixture's (make_adam_fixture.py's N and STEPS) */
    Fx fx = fx_open("sgd_scaler.bin", "tests/torch/sgd_scaler_fixture.py");
    int64_t attempts;
    int dt;
    const double *pat = fx_get(&fx, "foreach.pattern", &attempts, &dt);
    ck_assert(dt == 1 && attempts > STEPS && attempts < 32 && pat[0] != 0); /* the first attempt overflows */
    const float *p0 = fx_need(&fx, "foreach", "p0", 0, N), *grads = fx_need(&fx, "foreach", "grads", 0, STEPS * N);
    const float *want_p = fx_need(&fx, "foreach", "params", 0, attempts * N),
                *want_buf = fx_need(&fx, "foreach", "buf", 0, attempts * N);
    const double *lrs = fx_need(&fx, "foreach", "lrs", 1, STEPS), *scales = fx_need(&fx, "foreach", "scales", 1, attempts);
    Device d = cpu();
    AmpConfig a;
    amp_defaults(&a, "fp16");
    a.init_scale = 1024, a.growth_interval = 1000;
    GradScaler s;
    scaler_init(&s, &d, &a, PREC_FP16, NULL);
    Optimizer o;
    optim_init(&o, &d, N, lrs[0], 0.9, 5e-4);
    float *p = malloc(N * sizeof(float)), *g = malloc(N * sizeof(float));
    memcpy(p, p0, N * sizeof(float));
    int taken = 0;
    double worst = 0;
    for (int64_t t = 0; t < attempts; t++) {
        const int skip = pat[t] != 0;
        const float scale = scaler_get_scale(&s);
        for (int i = 0; i < N; i++) /* the fixture's I gradient: inf, NaN at every third */
            g[i] = skip ? (i % 3 ? INFINITY : NAN) : grads[(size_t)taken * N + i] * scale;
        scaler_step(&s, &o, p, g, N, lrs[skip ? (taken ? taken - 1 : 0) : taken]);
        scaler_update(&s);
        taken += !skip;
        double e = test_rel_err(p, want_p + t * N, N);
        ck_assert_msg(e <= 1e-6, "attempt %lld (%c): parameters %.3g from torch's SGD under GradScaler", (long long)t + 1,
                      skip ? 'I' : 'F', e);
        if (!isnan(want_buf[t * N])) { /* torch holds a buffer once a step was taken */
            double eb = test_rel_err(o.momentum_buf, want_buf + t * N, N);
            ck_assert_msg(eb <= 1e-6, "attempt %lld: momentum buffer %.3g from torch's", (long long)t + 1, eb);
            if (eb > worst) worst = eb;
        } else {
            ck_assert_msg(taken == 0, "attempt %lld: torch holds no buffer after a step was taken", (long long)t + 1);
        }
        ck_assert_msg(scaler_get_scale(&s) == (float)scales[t], "attempt %lld: scale %g, torch's %g", (long long)t + 1,
                      (double)scaler_get_scale(&s), scales[t]);
        if (e > worst) worst = e;
    }
    ck_assert_int_eq(taken, STEPS);
    /* torch's SGD(fused=True), from the same start: the scaler hands it found_inf, and it leaves the
     * parameters alone on the skipped first attempt — but it has already made its momentum buffer,
     * torch.empty_like(grad): memory the caching allocator hands back, never written. The next step
     * is no longer the first, so it takes 0.9 · that + g. Ours keeps to the contract (foreach's
     * trajectory) and so leaves the fused one at the first step taken; this says both, from the
     * fixture, so a torch that mends it shows here when the fixture is made again. */
    const float *fused_p = fx_need(&fx, "fused", "params", 0, attempts * N),
                *fused_buf = fx_need(&fx, "fused", "buf", 0, attempts * N);
    ck_assert_msg(!memcmp(fused_p, p0, N * sizeof(float)), "torch's fused SGD moved the parameters on a skipped step");
    int written = 0;
    for (int i = 0; i < N; i++) written += fused_buf[i] != 0.f;
    ck_assert_msg(written > 0, "torch's fused SGD held a zero buffer after the skipped first attempt: the lesson's "
                  "claim (an unset buffer) no longer holds for the torch that made the fixture");
    double reuse = 0; /* fused buf after the first step taken = 0.9 · (its unset buffer) + (g + wd · p0) */
    for (int i = 0; i < N; i++) {
        const float d_p = grads[i] + 5e-4f * p0[i];
        reuse = fmax(reuse, fabs((double)fused_buf[N + i] - (0.9 * (double)fused_buf[i] + d_p)));
    }
    ck_assert_msg(reuse <= 1e-5, "torch's fused SGD: the first step taken is not 0.9 * its unset buffer + g (%.3g)",
                  reuse);
    const double apart = test_rel_err(want_p + N, fused_p + N, N);
    ck_assert_msg(apart > 1e-2, "foreach and fused SGD agree after the first step taken (%.3g)", apart);
    printf("sgd under the scaler (first attempt skipped): within %.2g of torch's foreach SGD; torch's fused SGD "
           "%.2g away after one step (its unset buffer)\n", worst, apart);
    free(p), free(g);
    optim_destroy(&o);
    scaler_destroy(&s);
    device_destroy(&d);
}
END_TEST

/* Backoffs from the smallest allowed --init-scale cross 1/FLT_MAX: the steps are skipped, never
 * trained into NaN (they were: the loss read -nan with exit 0), and since no step can be taken again
 * the run says so at the epoch's end, once, and what to change (it used to go on in silence). */
START_TEST(stage5_scale_underflow_skips_not_nan) {
    char cmd[512], *out;
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage5 --device cpu --nproc-per-node 1 --model tiny --train-size 128 --test-size 32 "
                   "--batch-size 8 --steps 8 --epochs 1 --progress off --log-every 1 --init-scale 3e-39 "
                   "--test-inf-step 2 --master-port %d",
             test_root(), test_free_port());
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && !strstr(out, "nan") && strstr(out, "skipped") &&
                      strstr(out, "note: the GradScaler's scale fell to ") &&
                      strstr(out, "in epoch 1: 1/scale overflows fp32") && strstr(out, "--backoff-factor nearer 1"),
                  "exit %d:\n%s", rc, out);
    free(out);
}
END_TEST

/* The forced overflow of the lesson, through the whole model: --test-inf-step's injection (rank 0's
 * loss gradient made +inf at step 1) poisons every parameter gradient; the step is skipped — the
 * fp32 master weights and momentum are bit-identical afterwards — the scale halves, and the next
 * step trains. */
START_TEST(forced_overflow_skips_one_step) {
    Device d = cpu();
    AmpConfig a;
    amp_defaults(&a, "fp16");
    a.test_inf_step = 1;
    int n = 4;
    Model *m = model_create_mixed(&d, "tiny", 1, n, 3, PREC_FP16, 0);
    GradScaler s;
    scaler_init(&s, &d, &a, PREC_FP16, NULL);
    Optimizer o;
    optim_init(&o, &d, m->n_param_floats, 0.1, 0.9, 5e-4);
    float *x = rnd((int64_t)n * 3072, 41, -2, 2), *p0 = malloc(m->n_param_floats * 4);
    int32_t y[4] = {1, 2, 3, 4}, correct;
    float loss;
    for (int step = 1; step <= 2; step++) {
        memcpy(p0, m->param_flat, m->n_param_floats * 4);
        model_zero_grad(m);
        model_forward(m, n, x, 1);
        xent_forward_backward(&d, n, 10, model_logits(m), y, 1.0f / n, &loss, &correct, model_dlogits(m));
        ck_assert(isfinite(loss));
        scaler_scale_loss(&s, model_dlogits(m), n * 10);
        model_backward(m, n, NULL, NULL);
        int64_t counts[2] = {0, 0};
        count_zero_nonfinite(&d, m->n_param_floats, m->grad_flat, counts);
        int64_t zeros = 0, bad = 0; /* --grad-stats' counts, by hand */
        for (int64_t i = 0; i < m->n_param_floats; i++)
            zeros += m->grad_flat[i] == 0.0f, bad += !isfinite(m->grad_flat[i]);
        ck_assert_int_eq(counts[0], zeros);
        ck_assert_int_eq(counts[1], bad);
        scaler_step(&s, &o, m->param_flat, m->grad_flat, m->n_param_floats, 0.1);
        scaler_update(&s);
        if (step == 1) {
            ck_assert_int_gt(counts[1], m->n_param_floats / 2); /* the inf spread through backward */
            ck_assert(!memcmp(m->param_flat, p0, m->n_param_floats * 4));
            for (int64_t i = 0; i < m->n_param_floats; i++) ck_assert(o.momentum_buf[i] == 0.0f);
            ck_assert(scaler_get_scale(&s) == 32768.0f);
        } else {
            ck_assert_int_eq(counts[1], 0);
            ck_assert(memcmp(m->param_flat, p0, m->n_param_floats * 4));
            ck_assert(scaler_get_scale(&s) == 32768.0f);
        }
    }
    ck_assert_int_eq(scaler_skipped(&s), 1);
    free(x), free(p0);
    optim_destroy(&o);
    scaler_destroy(&s);
    model_destroy(m);
    device_destroy(&d);
}
END_TEST

/* scaler_report's check that the ranks decided alike: each rank adds (1, scale, skipped) into the
 * sums. A second rank with the same scale but one more skipped step (it stepped where this one did
 * not: the replicas differ now) is a disagreement; a second rank like this one is not. */
static void twin_rank(void *ctx, double *v, int n) {
    int skipped_more = *(const int *)ctx;
    v[0] *= 2, v[1] *= 2, v[2] = 2 * v[2] + skipped_more;
}

START_TEST(scaler_report_flags_ranks_that_disagree) {
    Device d = cpu();
    AmpConfig a;
    amp_defaults(&a, "fp16");
    GradScaler s;
    scaler_init(&s, &d, &a, PREC_FP16, NULL);
    char *dir = test_tmpdir(), path[600];
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    for (int more = 0; more <= 1; more++) {
        Report r;
        report_open(&r, path, "off", 1);
        scaler_report(&s, &a, PREC_FP16, &r, twin_rank, &more);
        report_close(&r);
        char *j = test_slurp(path, NULL), want[64];
        snprintf(want, sizeof want, "\"ranks\":2,\"ranks_agree\":%d", !more);
        ck_assert_msg(j && strstr(j, want), "%s wanted in %s", want, j);
        free(j);
    }
    unlink(path), rmdir(dir), free(dir);
    scaler_destroy(&s);
    device_destroy(&d);
}
END_TEST

/* ---- ./stage5 end to end ---------------------------------------------------------------------- */

#define SMALL "--device cpu --train-size 1024 --test-size 256 --batch-size 32 --progress off --log-every 1 "

static int run_stage5(const char *flags, const char *report, char **out) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage5 " SMALL "--master-port %d --report %s %s", test_root(),
             test_free_port(), report, flags);
    return test_run(cmd, out);
}

static char *report_path(const char *dir, const char *name) {
    char *p = malloc(600);
    snprintf(p, 600, "%s/%s.jsonl", dir, name);
    return p;
}

/* fp16 and bf16 on the CPU backend learn: over 24 steps the mean loss of the last 6 is well below
 * that of the first 6 (fp32 falls by ~0.3 here). */
START_TEST(stage5_learns_in_fp16_and_bf16) {
    char *dir = test_tmpdir();
    const char *modes[] = {"fp16", "bf16"};
    for (int i = 0; i < 2; i++) {
        char flags[256], *out;
        snprintf(flags, sizeof flags, "--nproc-per-node 1 --accum-steps 1 --steps 24 --batch-size 64 --amp %s", modes[i]);
        char *rep = report_path(dir, modes[i]);
        ck_assert_msg(run_stage5(flags, rep, &out) == 0, "%s", out);
        ck_assert_msg(strstr(out, "amp: ") != NULL, "%s", out);
        /* the CPU note names the GradScaler only where one runs (bf16 has none) */
        ck_assert_msg(i == 0 ? strstr(out, "so the GradScaler, overflow and underflow are real") != NULL
                             : strstr(out, "bf16 is emulated") && !strstr(out, "so the GradScaler"), "%s", out);
        double loss[64];
        ck_assert_int_eq(test_read_losses(rep, loss, 64), 24);
        double first = 0, last = 0;
        for (int k = 0; k < 6; k++) first += loss[k] / 6, last += loss[18 + k] / 6;
        ck_assert_msg(last < first - 0.1, "%s: loss %.3f -> %.3f", modes[i], first, last);
        free(out), free(rep);
    }
    free(dir);
}
END_TEST

/* With 2 ranks and --test-inf-step 3 (rank 0's gradient only), the all-reduce spreads the inf, and
 * both ranks skip step 3: the report's rank-summed scale and skip count say every rank agrees. With
 * 2 micro-batches per optimizer step the scaler still acts once per optimizer step: one skip, one
 * backoff. */
START_TEST(stage5_forced_overflow_every_rank_skips) {
    char *dir = test_tmpdir(), *out, *rep = report_path(dir, "inf");
    ck_assert_msg(run_stage5("--nproc-per-node 2 --accum-steps 2 --steps 6 --test-inf-step 3", rep, &out) == 0, "%s", out);
    char *j = test_slurp(rep, NULL);
    ck_assert_msg(j && strstr(j, "\"skipped_steps\":1,") && strstr(j, "\"scale\":32768,") &&
                      strstr(j, "\"ranks\":2,\"ranks_agree\":1"), "%s\n%s", out, j ? j : "(no report)");
    double loss[16];
    ck_assert_int_eq(test_read_losses(rep, loss, 16), 6);
    for (int i = 0; i < 6; i++) ck_assert(isfinite(loss[i])); /* training continued */
    free(j), free(out), free(rep), free(dir);
}
END_TEST

/* --grad-stats: one count per optimizer step taken — not per step the run could have taken — and the
 * inf forced at step 2 is in step 2's count alone; the console line says how many steps were skipped. */
START_TEST(stage5_grad_stats_count_each_step_taken) {
    char *dir = test_tmpdir(), *out, *rep = report_path(dir, "stats");
    ck_assert_msg(run_stage5("--nproc-per-node 1 --accum-steps 1 --steps 3 --epochs 2 --amp fp16 --grad-stats "
                             "--test-inf-step 2", rep, &out) == 0, "%s", out);
    double zero[8], bad[8];
    ck_assert_int_eq(test_report_list(rep, "amp", "grad_zero_per_step", zero, 8), 3);
    ck_assert_int_eq(test_report_list(rep, "amp", "grad_nonfinite_per_step", bad, 8), 3);
    ck_assert_msg(bad[0] == 0 && bad[1] > 0 && bad[2] == 0, "non-finite per step %g %g %g", bad[0], bad[1], bad[2]);
    ck_assert_msg(strstr(out, "1 of 3 optimizer steps skipped") && strstr(out, "gradient elements per step: zero first"),
                  "%s", out);
    /* the CPU backend says what its fp16 can show (the scaler) and what it cannot (memory, speed) */
    ck_assert_msg(strstr(out, "note: CPU backend — fp16 is emulated") &&
                      strstr(out, "memory and speed show nothing of what fp16 saves on a GPU"), "%s", out);
    free(out), free(rep), free(dir);
}
END_TEST

/* --no-grad-scaler's lesson when it goes wrong: at --lr 100 fp16's gradients overflow, the weights go
 * NaN and the run stops as diverged — and its per-step counts, which show where it went, are still in
 * the report (they used to be written only at the run's end, which a diverged run never reaches). */
START_TEST(stage5_diverged_run_keeps_its_grad_counts) {
    char *dir = test_tmpdir(), *out, *rep = report_path(dir, "div");
    ck_assert_int_eq(run_stage5("--nproc-per-node 1 --accum-steps 1 --epochs 1 --amp fp16 --no-grad-scaler --lr 100",
                                rep, &out), 2);
    ck_assert_msg(strstr(out, "training diverged") && strstr(out, "(the first at step "), "%s", out);
    /* a NaN loss reads "nan", as torch prints it, not printf's "-nan" of a NaN with its sign bit set */
    ck_assert_msg(strstr(out, "loss nan") && !strstr(out, "-nan"), "%s", out);
    double bad[64];
    int n = test_report_list(rep, "amp", "grad_nonfinite_per_step", bad, 64);
    ck_assert_msg(n >= 2 && bad[0] == 0 && bad[n - 1] > 0, "%d steps, non-finite first %g last %g", n, bad[0],
                  n ? bad[n - 1] : -1.0);
    char *j = test_slurp(rep, NULL);
    ck_assert_msg(j && strstr(j, "\"diverged\":1"), "%s", j);
    free(j), free(out), free(rep), free(dir);
}
END_TEST

/* A --test-inf-step the run never reaches (here --steps 3 stops it first) injects nothing, and says so
 * instead of leaving the student to wonder why no step was skipped. */
START_TEST(stage5_test_inf_step_past_the_end_says_so) {
    char *dir = test_tmpdir(), *out, *rep = report_path(dir, "late");
    ck_assert_msg(run_stage5("--nproc-per-node 1 --accum-steps 1 --steps 3 --epochs 2 --amp fp16 --test-inf-step 5",
                             rep, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "--test-inf-step 5 is after step 3, this run's last: no inf is injected") &&
                      strstr(out, "0 of 3 optimizer steps skipped"), "%s", out);
    free(out);
    /* a run of one optimizer step says "of 1 optimizer step", as the summary and the clipping line do */
    ck_assert_msg(run_stage5("--nproc-per-node 1 --steps 1 --amp fp16 --test-inf-step 1", rep, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "1 of 1 optimizer step skipped") && !strstr(out, "1 optimizer steps"), "%s", out);
    free(out), free(rep), free(dir);
}
END_TEST

/* --amp off is stage 4 exactly (stage 5 builds on it): the AMP lines are pass-throughs when disabled.
 * Over three epochs, so that each epoch's new sampler order (set_epoch) is compared too: of 4 batches
 * (two steps of K = 2), and of 5, whose epoch ends in a group of one micro-batch — the epoch's last
 * batch synchronises and steps too, as `i + 1 == len(loader)` says (else its gradient would wait for
 * the next epoch's). */
#define THREE_EPOCHS "--nproc-per-node 1 --epochs 3 --accum-steps 2 "
START_TEST(stage5_amp_off_is_stage4) {
    const int sizes[] = {128, 160}, steps[] = {6, 9};
    for (int k = 0; k < 2; k++) {
        char *dir = test_tmpdir(), *out, cmd[2048], flags[256], s5[300];
        char *a = report_path(dir, "s5"), *b = report_path(dir, "s4");
        snprintf(flags, sizeof flags, THREE_EPOCHS "--train-size %d ", sizes[k]);
        snprintf(s5, sizeof s5, "%s--amp off", flags);
        ck_assert_msg(run_stage5(s5, a, &out) == 0, "%s", out);
        ck_assert_msg(!strstr(out, "is emulated"), "%s", out); /* fp32: nothing emulated to warn about */
        free(out);
        snprintf(cmd, sizeof cmd, LIMIT "%s/stage4 " SMALL "%s--master-port %d --report %s", test_root(), flags,
                 test_free_port(), b);
        ck_assert_msg(test_run(cmd, &out) == 0, "%s", out);
        double la[16], lb[16];
        ck_assert_int_eq(test_read_losses(a, la, 16), steps[k]);
        ck_assert_int_eq(test_read_losses(b, lb, 16), steps[k]);
        for (int i = 0; i < steps[k]; i++)
            ck_assert_msg(la[i] == lb[i], "%d samples, step %d: %.9g vs %.9g", sizes[k], i + 1, la[i], lb[i]);
        free(out), free(a), free(b), free(dir);
    }
}
END_TEST

/* The summary's "allreduce_bytes" of a report (−1 if absent). */
static long long report_allreduce_bytes(const char *rep) {
    char *j = test_slurp(rep, NULL), *at = j ? strstr(j, "\"allreduce_bytes\":") : NULL;
    long long v = -1;
    if (at) sscanf(at + strlen("\"allreduce_bytes\":"), "%lld", &v);
    free(j);
    return v;
}

/* --grad-comm fp16 / bf16 (DDP's compression hooks): the same all-reduces with exactly half the
 * bytes, the 16-bit rounding of the averaged gradients barely moves the loss, and the hook says so. */
START_TEST(stage5_grad_comm_halves_the_bytes) {
    char *dir = test_tmpdir();
    const char *types[] = {"fp32", "fp16", "bf16"};
    long long bytes[3];
    double loss[3][8];
    for (int i = 0; i < 3; i++) {
        char flags[128], *out, *rep = report_path(dir, types[i]);
        snprintf(flags, sizeof flags, "--nproc-per-node 2 --steps 6 --amp fp16 --grad-comm %s", types[i]);
        ck_assert_msg(run_stage5(flags, rep, &out) == 0, "%s", out);
        if (i) ck_assert_msg(strstr(out, "_compress_hook: each bucket is all-reduced in"), "%s", out);
        bytes[i] = report_allreduce_bytes(rep);
        ck_assert_int_eq(test_read_losses(rep, loss[i], 8), 6);
        free(out), free(rep);
    }
    ck_assert(bytes[0] > 0);
    for (int i = 1; i < 3; i++) {
        ck_assert_msg(2 * bytes[i] == bytes[0], "%s: %lld bytes against fp32's %lld", types[i], bytes[i], bytes[0]);
        /* fp16 keeps 11 significant bits, bf16 8: rounding every reduced gradient so moved the loss by
         * 1e-5 to 2e-4 of itself over these 6 steps (both types); a bucket all-reduced as the other
         * 16-bit type moved it 0.3% by step 2 and 1% by step 6, which 1% let pass */
        for (int k = 0; k < 6; k++)
            ck_assert_msg(fabs(loss[i][k] - loss[0][k]) < 2e-3 * loss[0][k], "%s step %d: %.6f vs %.6f", types[i],
                          k + 1, loss[i][k], loss[0][k]);
    }
    free(dir);
}
END_TEST

/* Bad flag combinations: one clear line, exit 2. */
START_TEST(stage5_rejects_bad_amp_flags) {
    struct {
        const char *flags, *says;
    } bad[] = {
        {"--amp bf16 --no-grad-scaler", "--no-grad-scaler only applies to --amp fp16"},
        {"--amp off --no-grad-scaler", "never use a scaler): drop --no-grad-scaler (or train with --amp fp16)\n"},
        {"--amp off --test-inf-step 2", "--test-inf-step needs the GradScaler"},
        {"--grad-comm fp8", "--grad-comm must be one of fp32|fp16|bf16"},
        {"--show-scaler FFX", "pattern of F"},
        {"--amp fp8", "--amp must be one of fp16|bf16|off"},
        {"--growth-factor 1", "--growth-factor must be a number in (1, 1000000]"},
        {"--backoff-factor 1", "--backoff-factor must be a number in (0, 1)"},
        {"--init-scale 1e-40", "1/scale overflows fp32"}, /* a NaN step the scaler would not skip */
        {"--amp bf16 --show-scaler FIF", "--show-scaler shows fp16's GradScaler: drop --amp bf16"},
        {"--amp fp16 --no-grad-scaler --show-scaler FIF", "GradScaler: drop --no-grad-scaler\n"}, /* not --amp */
        {"--show-scaler FIF --show-sampler --dataset-size 10", "run them one at a time"},
        /* a flag the lesson does not read (here --nproc-per-node, given to every case) is refused */
        {"--show-scaler FIF --growth-interval 1", "--nproc-per-node is not read by --show-scaler"},
        /* the scaler's knobs without a scaler: refused, not silently ignored */
        {"--amp off --init-scale 1024", "--init-scale tunes fp16's GradScaler, and --amp off runs without one"},
        {"--amp bf16 --backoff-factor 0.25", "--backoff-factor tunes fp16's GradScaler, and --amp bf16"},
        {"--no-grad-scaler --growth-interval 5", "--growth-interval tunes fp16's GradScaler, and --no-grad-scaler"},
        {"--amp bf16 --growth-factor 4", "drop --growth-factor"},
        {"--channels-last --layout nchw", "--channels-last and --layout nchw contradict each other"},
        {"--amp bf16 --optimizer-overlap after-backward --sync-each-micro-step", "drop one of the two"},
        {"--amp bf16 --optimizer-overlap in-backward --no-overlap", "--no-overlap has no buckets"},
        {"--growth-interval 0", "--growth-interval must be an integer in [1,"}, /* 0: the scale never grows */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[512], *out;
        snprintf(cmd, sizeof cmd, LIMIT "%s/stage5 --device cpu --nproc-per-node 1 --master-port %d %s", test_root(),
                 test_free_port(), bad[i].flags);
        ck_assert_int_eq(test_run(cmd, &out), 2);
        ck_assert_msg(strstr(out, bad[i].says), "%s: %s", bad[i].flags, out);
        /* refused once, by the launcher, not by every worker after it started them */
        ck_assert_msg(!strstr(out, "launching"), "%s: refused only after the workers started:\n%s", bad[i].flags, out);
        free(out);
    }
}
END_TEST

Suite *suite_amp(void) {
    Suite *s = suite_create("amp");
    TCase *tc = tcase_create("amp");
    tcase_add_test(tc, fp16_rounding_exhaustive);
    tcase_add_test(tc, bf16_rounding_exhaustive);
    tcase_add_test(tc, round_array_equals_conversion);
    tcase_add_test(tc, scale_stored_is_one_product_rounded_once);
    tcase_add_test(tc, conv_and_linear_within_rounding_bound);
    tcase_add_test(tc, elementwise_and_pool_within_rounding_bound);
    tcase_add_test(tc, cast_add_clear_adds_into_the_fp32_gradients);
    tcase_add_test(tc, count_zero_nonfinite_adds_to_its_counters);
    tcase_add_test(tc, add_relu_backward_each_branch_its_own_accumulate);
    tcase_add_test(tc, batch_norm_within_bound);
    tcase_add_test(tc, fp16_overflows_and_underflows_bf16_does_not);
    tcase_add_test(tc, model_under_autocast_tracks_fp32);
    tcase_add_test(tc, show_scaler_matches_torch);
    tcase_add_test(tc, show_scaler_defaults_are_torchs);
    tcase_add_test(tc, show_scaler_says_where_it_leaves_torch);
    tcase_add_test(tc, show_scaler_at_the_top_of_fp32);
    tcase_add_test(tc, scaler_skips_and_scales);
    tcase_add_test(tc, sgd_under_the_scaler_matches_torch);
    tcase_add_test(tc, forced_overflow_skips_one_step);
    tcase_add_test(tc, scaler_report_flags_ranks_that_disagree);
    tcase_add_test(tc, stage5_learns_in_fp16_and_bf16);
    tcase_add_test(tc, stage5_forced_overflow_every_rank_skips);
    tcase_add_test(tc, stage5_grad_stats_count_each_step_taken);
    tcase_add_test(tc, stage5_diverged_run_keeps_its_grad_counts);
    tcase_add_test(tc, stage5_test_inf_step_past_the_end_says_so);
    tcase_add_test(tc, stage5_amp_off_is_stage4);
    tcase_add_test(tc, stage5_grad_comm_halves_the_bytes);
    tcase_add_test(tc, stage5_rejects_bad_amp_flags);
    tcase_add_test(tc, stage5_scale_underflow_skips_not_nan);
    suite_add_tcase(s, tc);
    return s;
}
