/* test_ops_ref.c — the CPU reference ops (ops_ref.h) against finite differences, naive loops and
 * hand computations, all in float64 through the _f64 instantiation.
 *
 * Gradients are checked on a scalar loss L = Σ out·r with random r, so the op's backward called
 * with dy = r must equal the central difference (L(v+ε) − L(v−ε)) / 2ε for every input v.
 * Tolerance: with ε = 1e-6 the truncation error is ε²/6·|L'''| ≈ 1e-13 (zero for the bilinear
 * conv/linear) and the rounding error is ≈ 1e-16·|L|/ε ≈ 1e-9 for our |L| ≲ 10, against gradients
 * of order 0.1–10, so a correct op scores ~1e-8 relative; we accept 1e-6 (100× margin). Any real
 * bug — a wrong index, a missing term — is off by O(1). Forward results are checked separately
 * (naive loops, hand computations), since a gradient check only proves backward matches forward. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_threads.h"
#include "ops_ref.h"
#include "optim.h"
#include "tests.h"

#define FD_EPS 1e-6
#define FD_TOL 1e-6
#define EXACT_TOL 1e-12 /* same maths, different summation order, in double */

/* ---- helpers -------------------------------------------------------------------------------------- */

static double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

static double *drandom(int64_t n, uint64_t seed, double lo, double hi) {
    double *p = dalloc(n);
    test_fill_uniform_f64(p, n, seed, lo, hi);
    return p;
}

static void dfill(double *p, int64_t n, double v) {
    for (int64_t i = 0; i < n; i++) p[i] = v;
}

static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ‖got − want‖∞ / ‖want‖∞, NaN-aware (a NaN anywhere fails). */
static double rel_err(const double *got, const double *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(want[i])) return INFINITY;
        double d = fabs(got[i] - want[i]);
        if (d > num) num = d;
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return num / (den > 1e-300 ? den : 1e-300);
}

#define EXPECT_CLOSE(got, want, n, tol, what)                                                      \
    do {                                                                                           \
        double e_ = rel_err((got), (want), (n));                                                   \
        ck_assert_msg(e_ < (tol), "%s: relative error %.3g (tolerance %.1g)", (what), e_,          \
                      (double)(tol));                                                              \
    } while (0)

/* Central differences of loss() with respect to each of v[0..n): g[i] = ∂loss/∂v[i]. */
static void fd_grad(double (*loss)(void *), void *ctx, double *v, int64_t n, double *g) {
    for (int64_t i = 0; i < n; i++) {
        double saved = v[i];
        v[i] = saved + FD_EPS;
        double lp = loss(ctx);
        v[i] = saved - FD_EPS;
        double lm = loss(ctx);
        v[i] = saved;
        g[i] = (lp - lm) / (2 * FD_EPS);
    }
}

/* ---- convolution ---------------------------------------------------------------------------------- */

typedef struct {
    int cin, cout, k, stride, pad, h, w;
} ConvCfg;

/* Shapes for the gradient checks: padded 3×3 at stride 1 and 2, 1×1 at stride 2 (the ResNet
 * shortcut), and 1×1 at stride 1 (the pointwise path that skips im2col); non-square, odd sizes. */
static const ConvCfg grad_cfgs[] = {
    {3, 4, 3, 1, 1, 5, 7}, {3, 4, 3, 2, 1, 6, 5}, {2, 3, 3, 2, 1, 7, 7},
    {4, 3, 1, 2, 0, 5, 7}, {4, 3, 1, 1, 0, 4, 5}, {4, 3, 1, 1, 1, 5, 7}, /* a padded 1×1: not pointwise */
};

static ConvShape make_shape(ConvCfg c) {
    ConvShape s;
    conv_shape(&s, c.cin, c.cout, c.k, c.stride, c.pad, c.h, c.w);
    return s;
}

static int64_t conv_in_size(const ConvShape *s, int n) { return (int64_t)n * s->cin * s->h * s->w; }
static int64_t conv_out_size(const ConvShape *s, int n) {
    return (int64_t)n * s->cout * s->hout * s->wout;
}
static int64_t conv_w_size(const ConvShape *s) { return (int64_t)s->cout * s->cin * s->k * s->k; }

/* The definition, as seven nested loops; mode 0: y = conv(x, w); 1: dx = convᵀ(dy, w); 2: dw. */
static void naive_conv(const ConvShape *s, int n, int mode, const double *x, const double *w,
                       const double *dy, double *out) {
    int64_t size = mode == 0 ? conv_out_size(s, n) : mode == 1 ? conv_in_size(s, n) : conv_w_size(s);
    dfill(out, size, 0);
    for (int i = 0; i < n; i++)
        for (int co = 0; co < s->cout; co++)
            for (int oh = 0; oh < s->hout; oh++)
                for (int ow = 0; ow < s->wout; ow++)
                    for (int ci = 0; ci < s->cin; ci++)
                        for (int ki = 0; ki < s->k; ki++)
                            for (int kj = 0; kj < s->k; kj++) {
                                int ih = oh * s->stride - s->pad + ki, iw = ow * s->stride - s->pad + kj;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                int64_t xi = (((int64_t)i * s->cin + ci) * s->h + ih) * s->w + iw;
                                int64_t wi = (((int64_t)co * s->cin + ci) * s->k + ki) * s->k + kj;
                                int64_t yi = (((int64_t)i * s->cout + co) * s->hout + oh) * s->wout + ow;
                                if (mode == 0) out[yi] += x[xi] * w[wi];
                                else if (mode == 1) out[xi] += dy[yi] * w[wi];
                                else out[wi] += dy[yi] * x[xi];
                            }
}

/* Against the naive loops: the gradient-check shapes (a gradient check alone would pass a wrong
 * forward whose backward is its exact adjoint), plus shapes that cross every GEMM blocking edge:
 * M > 128 rows and K > 256 (cout = 133, cin·k·k = 360, also as backward-data's M), ragged N
 * (P = 99), and a wide image (P = 2500 > 2048 columns). */
START_TEST(test_conv_matches_naive) {
    const ConvCfg big[] = {{40, 133, 3, 1, 1, 9, 11}, {2, 3, 3, 1, 1, 50, 50}};
    size_t n_grad = sizeof grad_cfgs / sizeof grad_cfgs[0], n_big = sizeof big / sizeof big[0];
    for (size_t c = 0; c < n_grad + n_big; c++) {
        ConvShape s = make_shape(c < n_grad ? grad_cfgs[c] : big[c - n_grad]);
        int n = 2;
        int64_t nx = conv_in_size(&s, n), ny = conv_out_size(&s, n), nw = conv_w_size(&s);
        double *x = drandom(nx, 1, -1, 1), *w = drandom(nw, 2, -1, 1), *dy = drandom(ny, 3, -1, 1);
        double *got = dalloc(nx > ny ? (nx > nw ? nx : nw) : (ny > nw ? ny : nw));
        double *want = dalloc(nx > ny ? (nx > nw ? nx : nw) : (ny > nw ? ny : nw));

        ref_conv_forward_f64(&s, n, x, w, got);
        naive_conv(&s, n, 0, x, w, dy, want);
        EXPECT_CLOSE(got, want, ny, EXACT_TOL, "conv forward vs naive");

        ref_conv_backward_data_f64(&s, n, dy, w, got, 0);
        naive_conv(&s, n, 1, x, w, dy, want);
        EXPECT_CLOSE(got, want, nx, EXACT_TOL, "conv backward-data vs naive");

        dfill(got, nw, NAN); /* accumulate = 0 must overwrite */
        ref_conv_backward_filter_f64(&s, n, x, dy, got, 0);
        naive_conv(&s, n, 2, x, w, dy, want);
        EXPECT_CLOSE(got, want, nw, EXACT_TOL, "conv backward-filter vs naive");
        free(x), free(w), free(dy), free(got), free(want);
    }
}
END_TEST

typedef struct {
    ConvShape s;
    int n;
    double *x, *w, *y, *r;
} ConvCtx;

static double conv_loss(void *p) {
    ConvCtx *c = p;
    ref_conv_forward_f64(&c->s, c->n, c->x, c->w, c->y);
    return dot(c->y, c->r, conv_out_size(&c->s, c->n));
}

START_TEST(test_conv_gradcheck) {
    for (size_t k = 0; k < sizeof grad_cfgs / sizeof grad_cfgs[0]; k++) {
        ConvCtx c = {.s = make_shape(grad_cfgs[k]), .n = 2};
        int64_t nx = conv_in_size(&c.s, c.n), ny = conv_out_size(&c.s, c.n), nw = conv_w_size(&c.s);
        c.x = drandom(nx, 10 + k, -1, 1), c.w = drandom(nw, 20 + k, -1, 1);
        c.r = drandom(ny, 30 + k, -1, 1), c.y = dalloc(ny);
        double *dx = dalloc(nx), *dw = dalloc(nw), *num = dalloc(nx > nw ? nx : nw);

        dfill(dx, nx, NAN); /* accumulate = 0 must overwrite whatever was there */
        ref_conv_backward_data_f64(&c.s, c.n, c.r, c.w, dx, 0);
        fd_grad(conv_loss, &c, c.x, nx, num);
        EXPECT_CLOSE(dx, num, nx, FD_TOL, "conv dx vs finite differences");

        dfill(dw, nw, NAN);
        ref_conv_backward_filter_f64(&c.s, c.n, c.x, c.r, dw, 0);
        fd_grad(conv_loss, &c, c.w, nw, num);
        EXPECT_CLOSE(dw, num, nw, FD_TOL, "conv dw vs finite differences");
        free(c.x), free(c.w), free(c.r), free(c.y), free(dx), free(dw), free(num);
    }
}
END_TEST

/* dx and dw with accumulate = 1 add to what is there (0 overwrites: the tests above). */
START_TEST(test_conv_accumulate) {
    for (size_t k = 0; k < sizeof grad_cfgs / sizeof grad_cfgs[0]; k++) {
        ConvShape s = make_shape(grad_cfgs[k]);
        int n = 2;
        int64_t nx = conv_in_size(&s, n), ny = conv_out_size(&s, n), nw = conv_w_size(&s);
        double *x = drandom(nx, 1, -1, 1), *w = drandom(nw, 2, -1, 1), *dy = drandom(ny, 3, -1, 1);
        double *prior_x = drandom(nx, 4, -5, 5), *prior_w = drandom(nw, 5, -5, 5);
        double *fresh = dalloc(nx > nw ? nx : nw), *got = dalloc(nx > nw ? nx : nw);

        ref_conv_backward_data_f64(&s, n, dy, w, fresh, 0);
        for (int64_t i = 0; i < nx; i++) fresh[i] += prior_x[i];
        memcpy(got, prior_x, sizeof(double) * nx);
        ref_conv_backward_data_f64(&s, n, dy, w, got, 1);
        EXPECT_CLOSE(got, fresh, nx, EXACT_TOL, "conv dx accumulate");

        ref_conv_backward_filter_f64(&s, n, x, dy, fresh, 0);
        for (int64_t i = 0; i < nw; i++) fresh[i] += prior_w[i];
        memcpy(got, prior_w, sizeof(double) * nw);
        ref_conv_backward_filter_f64(&s, n, x, dy, got, 1);
        EXPECT_CLOSE(got, fresh, nw, EXACT_TOL, "conv dw accumulates");
        free(x), free(w), free(dy), free(prior_x), free(prior_w), free(fresh), free(got);
    }
}
END_TEST

/* ---- batch norm ------------------------------------------------------------------------------------ */

typedef struct {
    int n, c, hw;
    double *x, *gamma, *beta, *rm, *rv, *sm, *si, *y, *r;
} BnCtx;

static double bn_loss(void *p) {
    BnCtx *b = p;
    ref_bn_forward_train_f64(b->n, b->c, b->hw, b->x, b->gamma, b->beta, b->rm, b->rv, 0.1, 1e-5,
                             b->sm, b->si, b->y);
    return dot(b->y, b->r, (int64_t)b->n * b->c * b->hw);
}

START_TEST(test_bn_train_forward_and_gradcheck) {
    BnCtx b = {.n = 3, .c = 2, .hw = 5};
    int64_t nx = (int64_t)b.n * b.c * b.hw;
    b.x = drandom(nx, 40, -1, 2), b.gamma = drandom(b.c, 41, 0.5, 1.5);
    b.beta = drandom(b.c, 42, -0.5, 0.5), b.r = drandom(nx, 43, -1, 1);
    b.rm = dalloc(b.c), b.rv = dalloc(b.c), b.sm = dalloc(b.c), b.si = dalloc(b.c), b.y = dalloc(nx);
    bn_loss(&b);

    /* forward: y = (x − μ)/sqrt(σ²_biased + eps)·γ + β, μ and σ² from the definition */
    double *want = dalloc(nx);
    for (int ch = 0; ch < b.c; ch++) {
        double m = 0, v = 0, N = b.n * b.hw;
        for (int i = 0; i < b.n; i++)
            for (int j = 0; j < b.hw; j++) m += b.x[(i * b.c + ch) * b.hw + j] / N;
        for (int i = 0; i < b.n; i++)
            for (int j = 0; j < b.hw; j++) v += pow(b.x[(i * b.c + ch) * b.hw + j] - m, 2) / N;
        ck_assert_double_eq_tol(b.sm[ch], m, 1e-12);
        ck_assert_double_eq_tol(b.si[ch], 1 / sqrt(v + 1e-5), 1e-9);
        for (int i = 0; i < b.n; i++)
            for (int j = 0; j < b.hw; j++) {
                int64_t o = (i * b.c + ch) * b.hw + j;
                want[o] = (b.x[o] - m) / sqrt(v + 1e-5) * b.gamma[ch] + b.beta[ch];
            }
    }
    EXPECT_CLOSE(b.y, want, nx, EXACT_TOL, "bn train forward");

    double *dx = dalloc(nx), *dg = dalloc(b.c), *db = dalloc(b.c), *num = dalloc(nx);
    dfill(dx, nx, NAN);
    ref_bn_backward_f64(b.n, b.c, b.hw, b.x, b.r, b.gamma, b.sm, b.si, 1e-5, dx, dg, db, 0);
    fd_grad(bn_loss, &b, b.x, nx, num);
    EXPECT_CLOSE(dx, num, nx, FD_TOL, "bn dx vs finite differences");
    fd_grad(bn_loss, &b, b.gamma, b.c, num);
    EXPECT_CLOSE(dg, num, b.c, FD_TOL, "bn dgamma vs finite differences");
    fd_grad(bn_loss, &b, b.beta, b.c, num);
    EXPECT_CLOSE(db, num, b.c, FD_TOL, "bn dbeta vs finite differences");
    free(b.x), free(b.gamma), free(b.beta), free(b.r), free(b.rm), free(b.rv), free(b.sm);
    free(b.si), free(b.y), free(want), free(dx), free(dg), free(db), free(num);
}
END_TEST

/* Two channels, worked by hand: channel 0 holds {1, 2, 3, 6} (mean 3, Σ(x−μ)² = 14: biased var
 * 3.5, unbiased 14/3), channel 1 holds {10, 20, 30, 40} (mean 25, Σ = 500: 125 and 500/3).
 * Running stats start at mean {0.5, −1}, var {2, 1}; momentum 0.1:
 *   mean: 0.9·0.5 + 0.1·3 = 0.75,   0.9·(−1) + 0.1·25 = 1.6
 *   var:  0.9·2 + 0.1·14/3 = 34/15,  0.9·1 + 0.1·500/3 = 527/30   (unbiased, as PyTorch). */
START_TEST(test_bn_running_stats_by_hand) {
    double x[8] = {1, 2, 10, 20, /* image 0: ch0, ch1 */ 3, 6, 30, 40 /* image 1 */};
    double gamma[2] = {1, 1}, beta[2] = {0, 0}, rm[2] = {0.5, -1}, rv[2] = {2, 1};
    double sm[2], si[2], y[8];
    ref_bn_forward_train_f64(2, 2, 2, x, gamma, beta, rm, rv, 0.1, 1e-5, sm, si, y);
    ck_assert_double_eq_tol(rm[0], 0.75, 1e-15);
    ck_assert_double_eq_tol(rm[1], 1.6, 1e-15);
    ck_assert_double_eq_tol(rv[0], 34.0 / 15, 1e-14);
    ck_assert_double_eq_tol(rv[1], 527.0 / 30, 1e-13);
    ck_assert_double_eq_tol(sm[0], 3, 1e-15);
    ck_assert_double_eq_tol(sm[1], 25, 1e-15);
    ck_assert_double_eq_tol(si[0], 1 / sqrt(3.5 + 1e-5), 1e-15);
    ck_assert_double_eq_tol(si[1], 1 / sqrt(125 + 1e-5), 1e-15);
    ck_assert_double_eq_tol(y[5], (6 - 3) / sqrt(3.5 + 1e-5), 1e-14); /* image 1, ch 0: x = 6 */
}
END_TEST

/* Eval mode uses the running statistics: with mean 1, var 3, eps 1 → invstd 1/2, so x = 5,
 * γ = 2, β = 1 gives (5 − 1)·½·2 + 1 = 5; and a random case against the formula. */
START_TEST(test_bn_eval_formula) {
    double x[1] = {5}, g[1] = {2}, b[1] = {1}, rm[1] = {1}, rv[1] = {3}, y[1];
    ref_bn_forward_eval_f64(1, 1, 1, x, g, b, rm, rv, 1.0, y);
    ck_assert_double_eq_tol(y[0], 5.0, 1e-15);

    int n = 2, c = 3, hw = 4;
    int64_t nx = (int64_t)n * c * hw;
    double *xs = drandom(nx, 50, -2, 2), *gs = drandom(c, 51, 0.5, 2), *bs = drandom(c, 52, -1, 1);
    double *rms = drandom(c, 53, -1, 1), *rvs = drandom(c, 54, 0.1, 3);
    double *ys = dalloc(nx), *want = dalloc(nx);
    ref_bn_forward_eval_f64(n, c, hw, xs, gs, bs, rms, rvs, 1e-5, ys);
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (int j = 0; j < hw; j++) {
                int64_t o = ((int64_t)i * c + ch) * hw + j;
                want[o] = (xs[o] - rms[ch]) / sqrt(rvs[ch] + 1e-5) * gs[ch] + bs[ch];
            }
    EXPECT_CLOSE(ys, want, nx, EXACT_TOL, "bn eval");
    free(xs), free(gs), free(bs), free(rms), free(rvs), free(ys), free(want);
}
END_TEST

START_TEST(test_bn_backward_accumulate) {
    int n = 2, c = 3, hw = 6;
    int64_t nx = (int64_t)n * c * hw;
    double *x = drandom(nx, 60, -1, 1), *dy = drandom(nx, 61, -1, 1), *g = drandom(c, 62, 0.5, 2);
    double *b = dalloc(c), *rm = dalloc(c), *rv = dalloc(c), *sm = dalloc(c), *si = dalloc(c);
    double *y = dalloc(nx);
    ref_bn_forward_train_f64(n, c, hw, x, g, b, rm, rv, 0.1, 1e-5, sm, si, y);

    double *dx0 = dalloc(nx), *dg0 = dalloc(c), *db0 = dalloc(c);
    ref_bn_backward_f64(n, c, hw, x, dy, g, sm, si, 1e-5, dx0, dg0, db0, 0);
    double *dx = drandom(nx, 63, -3, 3), *dg = drandom(c, 64, -3, 3), *db = drandom(c, 65, -3, 3);
    for (int64_t i = 0; i < nx; i++) dx0[i] += dx[i];
    for (int i = 0; i < c; i++) dg0[i] += dg[i], db0[i] += db[i];
    ref_bn_backward_f64(n, c, hw, x, dy, g, sm, si, 1e-5, dx, dg, db, 1);
    EXPECT_CLOSE(dx, dx0, nx, EXACT_TOL, "bn dx accumulate");
    EXPECT_CLOSE(dg, dg0, c, EXACT_TOL, "bn dgamma accumulates");
    EXPECT_CLOSE(db, db0, c, EXACT_TOL, "bn dbeta accumulates");
    free(x), free(dy), free(g), free(b), free(rm), free(rv), free(sm), free(si), free(y);
    free(dx0), free(dg0), free(db0), free(dx), free(dg), free(db);
}
END_TEST

/* ---- elementwise ---------------------------------------------------------------------------------- */

typedef struct {
    int64_t n;
    double *x, *y, *r;
} ReluCtx;

static double relu_loss(void *p) {
    ReluCtx *c = p;
    ref_relu_forward_f64(c->n, c->x, c->y);
    return dot(c->y, c->r, c->n);
}

START_TEST(test_relu) {
    ReluCtx c = {.n = 40};
    c.x = drandom(c.n, 70, -1, 1), c.r = drandom(c.n, 71, -1, 1), c.y = dalloc(c.n);
    /* keep every input ≥ 0.1 away from the kink at 0, far beyond ε */
    for (int64_t i = 0; i < c.n; i++) c.x[i] += c.x[i] < 0 ? -0.1 : 0.1;
    relu_loss(&c);
    for (int64_t i = 0; i < c.n; i++) ck_assert_double_eq(c.y[i], c.x[i] > 0 ? c.x[i] : 0);

    double *dx = dalloc(c.n), *num = dalloc(c.n);
    dfill(dx, c.n, NAN);
    ref_relu_backward_f64(c.n, c.y, c.r, dx, 0);
    fd_grad(relu_loss, &c, c.x, c.n, num);
    EXPECT_CLOSE(dx, num, c.n, FD_TOL, "relu dx vs finite differences");

    /* accumulate adds; in place (x == y, dx == dy) gives the same numbers */
    double *acc = drandom(c.n, 72, -1, 1), *want = dalloc(c.n);
    for (int64_t i = 0; i < c.n; i++) want[i] = acc[i] + dx[i];
    ref_relu_backward_f64(c.n, c.y, c.r, acc, 1);
    EXPECT_CLOSE(acc, want, c.n, 1e-15, "relu dx accumulate");
    double *inplace = dalloc(c.n);
    memcpy(inplace, c.x, sizeof(double) * c.n);
    ref_relu_forward_f64(c.n, inplace, inplace);
    ck_assert_msg(!memcmp(inplace, c.y, sizeof(double) * c.n), "relu forward in place differs");
    memcpy(inplace, c.r, sizeof(double) * c.n);
    ref_relu_backward_f64(c.n, c.y, inplace, inplace, 0);
    ck_assert_msg(!memcmp(inplace, dx, sizeof(double) * c.n), "relu backward in place differs");
    free(c.x), free(c.r), free(c.y), free(dx), free(num), free(acc), free(want), free(inplace);
}
END_TEST

START_TEST(test_add_and_grad_pass) {
    double a[3] = {1, -2, 0.5}, b[3] = {0.25, 2, -4}, y[3];
    ref_add_forward_f64(3, a, b, y);
    ck_assert_double_eq(y[0], 1.25);
    ck_assert_double_eq(y[1], 0);
    ck_assert_double_eq(y[2], -3.5);

    /* add's backward is grad_pass into both operands: copy, then add */
    double src[3] = {1, 2, 3}, dst[3] = {NAN, NAN, NAN};
    ref_grad_pass_f64(3, src, dst, 0);
    ck_assert_double_eq(dst[0], 1);
    ck_assert_double_eq(dst[2], 3);
    ref_grad_pass_f64(3, src, dst, 1);
    ck_assert_double_eq(dst[0], 2);
    ck_assert_double_eq(dst[1], 4);
    ck_assert_double_eq(dst[2], 6);
    ref_grad_pass_f64(3, dst, dst, 0); /* a copy onto itself changes nothing */
    ck_assert_double_eq(dst[1], 4);
}
END_TEST

START_TEST(test_scale_and_add_inplace) {
    double x[3] = {1, -2, 3}, y[3] = {10, 20, 30};
    ref_scale_inplace_f64(3, x, 0.5);
    ck_assert_double_eq(x[0], 0.5);
    ck_assert_double_eq(x[1], -1);
    ck_assert_double_eq(x[2], 1.5);
    ref_add_inplace_f64(3, x, y);
    ck_assert_double_eq(y[0], 10.5);
    ck_assert_double_eq(y[1], 19);
    ck_assert_double_eq(y[2], 31.5);
    float xf[2] = {2, 4}, yf[2] = {1, 1};
    ref_scale_inplace_f32(2, xf, 0.25f);
    ref_add_inplace_f32(2, xf, yf);
    ck_assert_float_eq(yf[0], 1.5f);
    ck_assert_float_eq(yf[1], 2.0f);
}
END_TEST

/* ---- average pool ----------------------------------------------------------------------------------- */

typedef struct {
    int n, c, hw;
    double *x, *y, *r;
} PoolCtx;

static double pool_loss(void *p) {
    PoolCtx *c = p;
    ref_avgpool_forward_f64(c->n, c->c, c->hw, c->x, c->y);
    return dot(c->y, c->r, (int64_t)c->n * c->c);
}

START_TEST(test_avgpool) {
    PoolCtx c = {.n = 2, .c = 3, .hw = 5};
    int64_t nx = (int64_t)c.n * c.c * c.hw, ny = (int64_t)c.n * c.c;
    c.x = drandom(nx, 80, -1, 1), c.r = drandom(ny, 81, -1, 1), c.y = dalloc(ny);
    pool_loss(&c);
    double m = 0;
    for (int j = 0; j < c.hw; j++) m += c.x[1 * c.hw + j]; /* image 0, channel 1 */
    ck_assert_double_eq_tol(c.y[1], m / c.hw, 1e-15);

    double *dx = dalloc(nx), *num = dalloc(nx), *acc = drandom(nx, 82, -1, 1), *want = dalloc(nx);
    dfill(dx, nx, NAN);
    ref_avgpool_backward_f64(c.n, c.c, c.hw, c.r, dx, 0);
    fd_grad(pool_loss, &c, c.x, nx, num);
    EXPECT_CLOSE(dx, num, nx, FD_TOL, "avgpool dx vs finite differences");
    for (int64_t i = 0; i < nx; i++) want[i] = acc[i] + dx[i];
    ref_avgpool_backward_f64(c.n, c.c, c.hw, c.r, acc, 1);
    EXPECT_CLOSE(acc, want, nx, 1e-15, "avgpool dx accumulate");
    free(c.x), free(c.r), free(c.y), free(dx), free(num), free(acc), free(want);
}
END_TEST

/* ---- linear ------------------------------------------------------------------------------------- */

typedef struct {
    int n, in, out;
    double *x, *W, *b, *y, *r;
} LinCtx;

static double linear_loss(void *p) {
    LinCtx *c = p;
    ref_linear_forward_f64(c->n, c->in, c->out, c->x, c->W, c->b, c->y);
    return dot(c->y, c->r, (int64_t)c->n * c->out);
}

START_TEST(test_linear_forward_matches_naive) {
    /* in = 300 > the GEMM's 256-deep blocks; odd n and out leave ragged tiles */
    int n = 7, in = 300, out = 13;
    double *x = drandom((int64_t)n * in, 90, -1, 1), *W = drandom((int64_t)out * in, 91, -1, 1);
    double *b = drandom(out, 92, -1, 1), *y = dalloc((int64_t)n * out), *want = dalloc((int64_t)n * out);
    ref_linear_forward_f64(n, in, out, x, W, b, y);
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) {
            double s = b[o];
            for (int k = 0; k < in; k++) s += x[i * in + k] * W[o * in + k];
            want[i * out + o] = s;
        }
    EXPECT_CLOSE(y, want, (int64_t)n * out, EXACT_TOL, "linear forward vs naive");
    free(x), free(W), free(b), free(y), free(want);
}
END_TEST

START_TEST(test_linear_gradcheck_and_accumulate) {
    LinCtx c = {.n = 3, .in = 5, .out = 4};
    int64_t nx = (int64_t)c.n * c.in, nw = (int64_t)c.out * c.in, ny = (int64_t)c.n * c.out;
    c.x = drandom(nx, 100, -1, 1), c.W = drandom(nw, 101, -1, 1), c.b = drandom(c.out, 102, -1, 1);
    c.r = drandom(ny, 103, -1, 1), c.y = dalloc(ny);
    double *dx = dalloc(nx), *dW = dalloc(nw), *db = dalloc(c.out), *num = dalloc(nw);
    dfill(dx, nx, NAN);
    ref_linear_backward_f64(c.n, c.in, c.out, c.x, c.W, c.r, dx, dW, db, 0);
    fd_grad(linear_loss, &c, c.x, nx, num);
    EXPECT_CLOSE(dx, num, nx, FD_TOL, "linear dx vs finite differences");
    fd_grad(linear_loss, &c, c.W, nw, num);
    EXPECT_CLOSE(dW, num, nw, FD_TOL, "linear dW vs finite differences");
    fd_grad(linear_loss, &c, c.b, c.out, num);
    EXPECT_CLOSE(db, num, c.out, FD_TOL, "linear db vs finite differences");

    /* a second call with accumulate = 1 doubles everything */
    ref_linear_backward_f64(c.n, c.in, c.out, c.x, c.W, c.r, dx, dW, db, 1);
    fd_grad(linear_loss, &c, c.x, nx, num);
    for (int64_t i = 0; i < nx; i++) num[i] *= 2;
    EXPECT_CLOSE(dx, num, nx, FD_TOL, "linear dx accumulate");
    fd_grad(linear_loss, &c, c.W, nw, num);
    for (int64_t i = 0; i < nw; i++) num[i] *= 2;
    EXPECT_CLOSE(dW, num, nw, FD_TOL, "linear dW accumulates");
    fd_grad(linear_loss, &c, c.b, c.out, num);
    for (int i = 0; i < c.out; i++) num[i] *= 2;
    EXPECT_CLOSE(db, num, c.out, FD_TOL, "linear db accumulates");
    free(c.x), free(c.W), free(c.b), free(c.r), free(c.y), free(dx), free(dW), free(db), free(num);
}
END_TEST

/* ---- softmax + cross-entropy --------------------------------------------------------------------- */

typedef struct {
    int n, classes;
    double *z, *dz;
    int32_t *labels;
    double scale;
} XentCtx;

static double xent_loss(void *p) {
    XentCtx *c = p;
    double loss;
    int32_t correct;
    ref_xent_forward_backward_f64(c->n, c->classes, c->z, c->labels, c->scale, &loss, &correct,
                                  c->dz);
    return loss;
}

START_TEST(test_xent_gradcheck) {
    int32_t labels[3] = {2, 0, 4};
    /* scale 0.25 ≠ 1/n: the scale must apply as given (DataParallel passes 1/global batch) */
    XentCtx c = {.n = 3, .classes = 5, .labels = labels, .scale = 0.25};
    int64_t nz = (int64_t)c.n * c.classes;
    c.z = drandom(nz, 110, -3, 3), c.dz = dalloc(nz);
    double *dz = dalloc(nz), *num = dalloc(nz);
    xent_loss(&c);
    memcpy(dz, c.dz, sizeof(double) * nz);
    fd_grad(xent_loss, &c, c.z, nz, num);
    EXPECT_CLOSE(dz, num, nz, FD_TOL, "xent dlogits vs finite differences");

    /* in place (dlogits == logits) gives the same gradient */
    double loss, loss2;
    int32_t correct;
    ref_xent_forward_backward_f64(c.n, c.classes, c.z, labels, c.scale, &loss, &correct, dz);
    ref_xent_forward_backward_f64(c.n, c.classes, c.z, labels, c.scale, &loss2, &correct, c.z);
    EXPECT_CLOSE(c.z, dz, nz, 1e-15, "xent in place");
    ck_assert_double_eq(loss, loss2);
    free(c.z), free(c.dz), free(dz), free(num);
}
END_TEST

/* Loss and accuracy by hand: logits {0,0} → log 2; {1,2,3} with label 2 → log(1 + e⁻¹ + e⁻²).
 * Accuracy counts the FIRST maximum: {1,3,3} is right for label 1 and wrong for label 2;
 * {0,0,0} is right only for label 0. */
START_TEST(test_xent_by_hand) {
    double a[2] = {0, 0}, da[2];
    int32_t la[1] = {0}, correct;
    double loss;
    ref_xent_forward_backward_f64(1, 2, a, la, 1.0, &loss, &correct, da);
    ck_assert_double_eq_tol(loss, log(2.0), 1e-15);
    ck_assert_double_eq_tol(da[0], -0.5, 1e-15);
    ck_assert_double_eq_tol(da[1], 0.5, 1e-15);

    double z[5][3] = {{1, 2, 3}, {1, 3, 3}, {1, 3, 3}, {0, 0, 0}, {0, 0, 0}};
    int32_t labels[5] = {2, 1, 2, 0, 1};
    double dz[15];
    ref_xent_forward_backward_f64(5, 3, &z[0][0], labels, 0.5, &loss, &correct, dz);
    double want = log(1 + exp(-1.0) + exp(-2.0))     /* row 0 */
                  + 2 * (log(2 + exp(-2.0)))          /* rows 1, 2: lse − 3 = log(e⁻² + 2) */
                  + 2 * log(3.0);                     /* rows 3, 4 */
    ck_assert_double_eq_tol(loss, 0.5 * want, 1e-14);
    ck_assert_int_eq(correct, 3); /* rows 0, 1, 3 */

    float zf[6] = {1, 3, 3, 0, 0, 0}, dzf[6], lossf;
    int32_t lf[2] = {2, 0};
    ref_xent_forward_backward_f32(2, 3, zf, lf, 1.0f, &lossf, &correct, dzf);
    ck_assert_int_eq(correct, 1);
}
END_TEST

/* A NaN logit is the maximum, as torch.argmax has it (NaN propagates; the first NaN wins): row 0's
 * first NaN is at 1, row 2's NaN beats the 9 before it. Ignoring NaNs counted rows 0 and 2 wrong. */
START_TEST(test_xent_nan_is_the_maximum) {
    float zf[4][4] = {{1, NAN, 3, NAN}, {NAN, 5, 1, 1}, {2, 9, NAN, 0}, {1, 2, 3, 4}}, dzf[16], lossf;
    double zd[4][4], dzd[16], lossd;
    int32_t labels[4] = {1, 0, 2, 3}, correct = -1;
    for (int i = 0; i < 16; i++) zd[i / 4][i % 4] = zf[i / 4][i % 4];
    ref_xent_forward_backward_f32(4, 4, &zf[0][0], labels, 0.25f, &lossf, &correct, dzf);
    ck_assert_int_eq(correct, 4);
    ck_assert(isnan(lossf));
    correct = -1;
    ref_xent_forward_backward_f64(4, 4, &zd[0][0], labels, 0.25, &lossd, &correct, dzd);
    ck_assert_int_eq(correct, 4);
    ck_assert(isnan(lossd));
}
END_TEST

/* ---- SGD ------------------------------------------------------------------------------------------ */

/* Three steps of PyTorch's SGD(lr 0.1, momentum 0.9, weight_decay 0.01), worked by hand.
 * Parameter 0 starts at 1 with gradients 0.5, −1, 2:
 *   1: g' = 0.5 + 0.01·1 = 0.51;        buf = 0.51 (first step: no momentum);  p = 0.949
 *   2: g' = −1 + 0.00949 = −0.99051;    buf = 0.9·0.51 − 0.99051 = −0.53151;   p = 1.002151
 *   3: g' = 2 + 0.01002151 = 2.01002151; buf = 0.9·(−0.53151) + g' = 1.53166251; p = 0.848984749
 * Parameter 1 starts at −2 with zero gradients (weight decay alone):
 *   p = −1.998, −1.994202, −1.988789598. */
START_TEST(test_sgd_by_hand) {
    double p[2] = {1, -2}, buf[2] = {NAN, NAN}; /* the first step must ignore the buffer */
    double grads[3][2] = {{0.5, 0}, {-1, 0}, {2, 0}};
    double want0[3] = {0.949, 1.002151, 0.848984749}, want1[3] = {-1.998, -1.994202, -1.988789598};
    for (int step = 0; step < 3; step++) {
        ref_sgd_step_f64(2, p, grads[step], buf, 0.1, 0.9, 0.01, step == 0);
        ck_assert_double_eq_tol(p[0], want0[step], 1e-14);
        ck_assert_double_eq_tol(p[1], want1[step], 1e-14);
    }
    ck_assert_double_eq_tol(buf[0], 1.53166251, 1e-14);

    /* momentum 0: plain p −= lr·(g + wd·p), and no buffer at all */
    double q[1] = {1}, g1[1] = {0.5}, g2[1] = {-1};
    ref_sgd_step_f64(1, q, g1, NULL, 0.1, 0, 0.01, 1);
    ck_assert_double_eq_tol(q[0], 0.949, 1e-15);
    ref_sgd_step_f64(1, q, g2, NULL, 0.1, 0, 0.01, 0);
    ck_assert_double_eq_tol(q[0], 1.048051, 1e-15);

    /* the float instantiation follows */
    float pf[1] = {1}, bf[1] = {0}, gf[3] = {0.5f, -1, 2};
    for (int step = 0; step < 3; step++) ref_sgd_step_f32(1, pf, &gf[step], bf, 0.1f, 0.9f, 0.01f, step == 0);
    ck_assert_float_eq_tol(pf[0], 0.848984749f, 1e-6f);
}
END_TEST

/* The optimizer over a flat buffer (optim.h) on the CPU device: the trajectory above in float, so
 * optim_step must tell SGD that its first step is the first (the buffer starts as that gradient) and
 * no later one is — and optim_step_unless with nothing to skip steps the same way. */
START_TEST(test_optimizer_sgd_steps_by_hand) {
    for (int unless = 0; unless <= 1; unless++) {
        Device d;
        device_init(&d, DEV_CPU, 0, -1);
        Optimizer o;
        optim_init(&o, &d, 2, 0.1, 0.9, 0.01);
        float p[2] = {1, -2}, grads[3][2] = {{0.5f, 0}, {-1, 0}, {2, 0}};
        const float skip = 0.0f;
        const double want0[3] = {0.949, 1.002151, 0.848984749}, want1[3] = {-1.998, -1.994202, -1.988789598};
        for (int step = 0; step < 3; step++) {
            if (unless) optim_step_unless(&o, p, grads[step], 0.1, &skip);
            else optim_step(&o, p, grads[step], 0.1);
            ck_assert_msg(fabs(p[0] - want0[step]) < 1e-6 && fabs(p[1] - want1[step]) < 1e-6,
                          "%s, step %d: (%.9g, %.9g), want (%.9g, %.9g)", unless ? "optim_step_unless" : "optim_step",
                          step, (double)p[0], (double)p[1], want0[step], want1[step]);
        }
        ck_assert_int_eq(o.steps, 3);
        optim_destroy(&o);
        device_destroy(&d);
    }
}
END_TEST

/* ---- float vs double ----------------------------------------------------------------------------- */

static float *to_f32(const double *d, int64_t n) {
    float *f = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) f[i] = (float)d[i];
    return f;
}

/* Relative error of a float result against the double one, as ‖·‖∞ ratios. */
static double f32_vs_f64(const float *f, const double *d, int64_t n) {
    double *up = dalloc(n);
    for (int64_t i = 0; i < n; i++) up[i] = f[i];
    double e = rel_err(up, d, n);
    free(up);
    return e;
}

/* The two instantiations are the same code, so they agree to float rounding: with sums of ≤ 288
 * terms of O(1) products, float's 6e-8 unit roundoff accumulates to ~1e-6 relative at worst. */
START_TEST(test_f32_agrees_with_f64) {
    ConvShape s;
    conv_shape(&s, 16, 32, 3, 2, 1, 12, 10);
    int n = 3;
    int64_t nx = conv_in_size(&s, n), ny = conv_out_size(&s, n), nw = conv_w_size(&s);
    double *x = drandom(nx, 120, -1, 1), *w = drandom(nw, 121, -1, 1), *dy = drandom(ny, 122, -1, 1);
    float *xf = to_f32(x, nx), *wf = to_f32(w, nw), *dyf = to_f32(dy, ny);
    for (int64_t i = 0; i < nx; i++) x[i] = xf[i]; /* identical inputs for both */
    for (int64_t i = 0; i < nw; i++) w[i] = wf[i];
    for (int64_t i = 0; i < ny; i++) dy[i] = dyf[i];
    double *y = dalloc(ny), *dx = dalloc(nx), *dw = dalloc(nw);
    float *yf = calloc(ny, 4), *dxf = calloc(nx, 4), *dwf = calloc(nw, 4);
    ref_conv_forward_f64(&s, n, x, w, y);
    ref_conv_forward_f32(&s, n, xf, wf, yf);
    ck_assert_double_lt(f32_vs_f64(yf, y, ny), 1e-5);
    ref_conv_backward_data_f64(&s, n, dy, w, dx, 0);
    ref_conv_backward_data_f32(&s, n, dyf, wf, dxf, 0);
    ck_assert_double_lt(f32_vs_f64(dxf, dx, nx), 1e-5);
    ref_conv_backward_filter_f64(&s, n, x, dy, dw, 0);
    ref_conv_backward_filter_f32(&s, n, xf, dyf, dwf, 0);
    ck_assert_double_lt(f32_vs_f64(dwf, dw, nw), 1e-5);

    /* batch norm on the conv's output: forward, running stats, backward */
    int c = s.cout, hw = s.hout * s.wout;
    double *g = drandom(c, 123, 0.5, 1.5), *b = drandom(c, 124, -0.5, 0.5);
    float *gf = to_f32(g, c), *bf = to_f32(b, c);
    for (int i = 0; i < c; i++) g[i] = gf[i], b[i] = bf[i];
    for (int64_t i = 0; i < ny; i++) y[i] = yf[i];
    double *rm = dalloc(c), *rv = dalloc(c), *sm = dalloc(c), *si = dalloc(c), *by = dalloc(ny);
    float *rmf = calloc(c, 4), *rvf = calloc(c, 4), *smf = calloc(c, 4), *sif = calloc(c, 4);
    float *byf = calloc(ny, 4);
    ref_bn_forward_train_f64(n, c, hw, y, g, b, rm, rv, 0.1, 1e-5, sm, si, by);
    ref_bn_forward_train_f32(n, c, hw, yf, gf, bf, rmf, rvf, 0.1f, 1e-5f, smf, sif, byf);
    ck_assert_double_lt(f32_vs_f64(byf, by, ny), 1e-5);
    ck_assert_double_lt(f32_vs_f64(rvf, rv, c), 1e-5);
    ck_assert_double_lt(f32_vs_f64(sif, si, c), 1e-5);
    double *bdx = dalloc(ny), *dg = dalloc(c), *db = dalloc(c);
    float *bdxf = calloc(ny, 4), *dgf = calloc(c, 4), *dbf = calloc(c, 4);
    ref_bn_backward_f64(n, c, hw, y, dy, g, sm, si, 1e-5, bdx, dg, db, 0);
    ref_bn_backward_f32(n, c, hw, yf, dyf, gf, smf, sif, 1e-5f, bdxf, dgf, dbf, 0);
    ck_assert_double_lt(f32_vs_f64(bdxf, bdx, ny), 1e-5);
    ck_assert_double_lt(f32_vs_f64(dgf, dg, c), 1e-5);
    ck_assert_double_lt(f32_vs_f64(dbf, db, c), 1e-5);
    free(x), free(w), free(dy), free(xf), free(wf), free(dyf), free(y), free(dx), free(dw);
    free(yf), free(dxf), free(dwf), free(g), free(b), free(gf), free(bf), free(rm), free(rv);
    free(sm), free(si), free(by), free(rmf), free(rvf), free(smf), free(sif), free(byf);
    free(bdx), free(dg), free(db), free(bdxf), free(dgf), free(dbf);
}
END_TEST

/* ---- threads ------------------------------------------------------------------------------------- */

/* Stage 2 runs replicas on several threads at once; the conv scratch is per thread, so two threads
 * convolving different shapes concurrently get bit-identical results to a lone run. */
typedef struct {
    ConvShape s;
    int n;
    float *x, *w, *y;
} ConvJob;

static void *conv_job(void *p) {
    ConvJob *j = p;
    for (int rep = 0; rep < 20; rep++) ref_conv_forward_f32(&j->s, j->n, j->x, j->w, j->y);
    return NULL;
}

START_TEST(test_conv_threads) {
    ConvJob jobs[2];
    conv_shape(&jobs[0].s, 8, 16, 3, 1, 1, 16, 16);
    conv_shape(&jobs[1].s, 16, 8, 3, 2, 1, 12, 12);
    float *want[2];
    for (int t = 0; t < 2; t++) {
        ConvJob *j = &jobs[t];
        j->n = 4;
        int64_t nx = conv_in_size(&j->s, j->n), ny = conv_out_size(&j->s, j->n), nw = conv_w_size(&j->s);
        j->x = malloc(4 * nx), j->w = malloc(4 * nw), j->y = malloc(4 * ny), want[t] = malloc(4 * ny);
        test_fill_uniform(j->x, nx, 130 + t, -1, 1);
        test_fill_uniform(j->w, nw, 140 + t, -1, 1);
        ref_conv_forward_f32(&j->s, j->n, j->x, j->w, want[t]);
    }
    cpu_threads_set(2); /* both callers want the pool: one gets it, the other runs alone */
    pthread_t th[2];
    for (int t = 0; t < 2; t++) ck_assert_int_eq(pthread_create(&th[t], NULL, conv_job, &jobs[t]), 0);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    cpu_threads_set(1);
    for (int t = 0; t < 2; t++) {
        ck_assert_msg(!memcmp(jobs[t].y, want[t], 4 * conv_out_size(&jobs[t].s, jobs[t].n)),
                      "thread %d: result differs from the single-threaded run", t);
        free(jobs[t].x), free(jobs[t].w), free(jobs[t].y), free(want[t]);
    }
}
END_TEST

/* The pool: every index of [0, count) is run exactly once, in ranges of at least `grain`, whatever
 * the thread count — including a count that grows (helpers started for a later job must not run
 * an earlier one) and jobs smaller than the pool. */
typedef struct {
    int hits[1000];
    int ranges, short_range, grain;
} Cover;

static void cover_range(void *arg, int lo, int hi) {
    Cover *c = arg;
    for (int i = lo; i < hi; i++) __atomic_add_fetch(&c->hits[i], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->ranges, 1, __ATOMIC_RELAXED);
    if (hi - lo < c->grain) __atomic_store_n(&c->short_range, 1, __ATOMIC_RELAXED);
}

START_TEST(test_cpu_parallel_for_covers_once) {
    const int threads[] = {2, 5, 1, 3, 8}, counts[] = {0, 1, 2, 7, 64, 1000}, grains[] = {1, 8, 300};
    for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
        cpu_threads_set(threads[t]);
        ck_assert_int_eq(cpu_threads_get(), threads[t]);
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            for (size_t g = 0; g < sizeof grains / sizeof grains[0]; g++) {
                Cover cv = {.grain = grains[g]};
                cpu_parallel_for(counts[c], grains[g], cover_range, &cv);
                for (int i = 0; i < counts[c]; i++)
                    ck_assert_msg(cv.hits[i] == 1, "%d threads, count %d, grain %d: index %d ran %d times",
                                  threads[t], counts[c], grains[g], i, cv.hits[i]);
                int parts = counts[c] / grains[g] < threads[t] ? counts[c] / grains[g] : threads[t];
                ck_assert_int_eq(cv.ranges, counts[c] == 0 ? 0 : parts > 1 ? parts : 1);
                ck_assert_msg(!(parts > 1 && cv.short_range), "a range shorter than the grain %d", grains[g]);
            }
    }
    cpu_threads_set(1);
}
END_TEST

/* OMP_NUM_THREADS wins, as in PyTorch; else the online cores shared among the host's workers. */
START_TEST(test_cpu_threads_auto) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    unsetenv("OMP_NUM_THREADS");
    cpu_threads_share(1);
    ck_assert_int_eq(cpu_threads_auto(1), cores < CPU_THREADS_MAX ? (int)cores : CPU_THREADS_MAX);
    ck_assert_int_eq(cpu_threads_auto(2), cores / 2 > 1 ? (int)(cores / 2) : 1);
    cpu_threads_share(4);
    ck_assert_int_eq(cpu_threads_auto(1), cores / 4 > 1 ? (int)(cores / 4) : 1);
    ck_assert_int_eq(cpu_threads_auto(1000000), 1);
    setenv("OMP_NUM_THREADS", "3", 1);
    ck_assert_int_eq(cpu_threads_auto(1), 3);
    setenv("OMP_NUM_THREADS", "3x", 1); /* not a count: ignored, as the cores decide */
    ck_assert_int_eq(cpu_threads_auto(1), cores / 4 > 1 ? (int)(cores / 4) : 1);
    setenv("OMP_NUM_THREADS", "0", 1);
    ck_assert_int_eq(cpu_threads_auto(1), cores / 4 > 1 ? (int)(cores / 4) : 1);
    unsetenv("OMP_NUM_THREADS");
    cpu_threads_share(1);
}
END_TEST

/* The convolutions give the same bits on 1, 2, 3 and 7 threads: forward, input gradient (fresh and
 * accumulated) and weight gradient (fresh and accumulated), on the gradient-check shapes and the
 * blocking-edge ones, with batches that do not divide by the thread count and weight gradients
 * narrower than the threads (cin·k·k = 4). */
START_TEST(test_conv_same_bits_any_thread_count) {
    const ConvCfg big[] = {{40, 133, 3, 1, 1, 9, 11}, {2, 3, 3, 1, 1, 50, 50}, {16, 8, 3, 2, 1, 12, 12}};
    const int threads[] = {2, 3, 7}, batches[] = {1, 5};
    size_t n_grad = sizeof grad_cfgs / sizeof grad_cfgs[0], n_big = sizeof big / sizeof big[0];
    for (size_t c = 0; c < n_grad + n_big; c++)
        for (size_t b = 0; b < sizeof batches / sizeof batches[0]; b++) {
            ConvShape s = make_shape(c < n_grad ? grad_cfgs[c] : big[c - n_grad]);
            int n = batches[b];
            int64_t nx = conv_in_size(&s, n), ny = conv_out_size(&s, n), nw = conv_w_size(&s);
            int64_t sizes[5] = {ny, nx, nx, nw, nw};
            float *x = malloc(4 * nx), *w = malloc(4 * nw), *dy = malloc(4 * ny), *out[2][5];
            test_fill_uniform(x, nx, 150, -1, 1);
            test_fill_uniform(w, nw, 151, -1, 1);
            test_fill_uniform(dy, ny, 152, -1, 1);
            for (int run = 0; run < 2; run++)
                for (int o = 0; o < 5; o++) {
                    out[run][o] = malloc(4 * sizes[o]);
                    test_fill_uniform(out[run][o], sizes[o], 160 + o, -1, 1); /* what accumulate adds to */
                }
            for (size_t t = 0; t <= sizeof threads / sizeof threads[0]; t++) {
                int run = t > 0;
                cpu_threads_set(t == 0 ? 1 : threads[t - 1]);
                if (run)
                    for (int o = 0; o < 5; o++) test_fill_uniform(out[1][o], sizes[o], 160 + o, -1, 1);
                ref_conv_forward_f32(&s, n, x, w, out[run][0]);
                ref_conv_backward_data_f32(&s, n, dy, w, out[run][1], 0);
                ref_conv_backward_data_f32(&s, n, dy, w, out[run][2], 1);
                ref_conv_backward_filter_f32(&s, n, x, dy, out[run][3], 0);
                ref_conv_backward_filter_f32(&s, n, x, dy, out[run][4], 1);
                const char *what[5] = {"forward", "backward-data", "backward-data (accumulate)",
                                       "backward-filter", "backward-filter (accumulate)"};
                for (int o = 0; run && o < 5; o++)
                    ck_assert_msg(!memcmp(out[0][o], out[1][o], 4 * sizes[o]),
                                  "shape %zu, batch %d: %s on %d threads differs from one thread", c, n, what[o],
                                  threads[t - 1]);
            }
            free(x), free(w), free(dy);
            for (int run = 0; run < 2; run++)
                for (int o = 0; o < 5; o++) free(out[run][o]);
        }
    cpu_threads_set(1);
}
END_TEST

/* Batch norm (forward with its running statistics, backward fresh and accumulated) and ReLU (in
 * place too) give the same bits on 1 and 3 threads, with more channels than threads and fewer, and
 * a ReLU longer than several of its 16384-element blocks with a short last one. */
START_TEST(test_bn_relu_same_bits_any_thread_count) {
    const int shapes[][3] = {{5, 7, 33}, {3, 2, 50}, {2, 64, 256}}; /* n, c, hw */
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int n = shapes[k][0], c = shapes[k][1], hw = shapes[k][2];
        int64_t cnt = (int64_t)n * c * hw;
        float *x = malloc(4 * cnt), *dy = malloc(4 * cnt), *g = malloc(4 * c), *be = malloc(4 * c);
        test_fill_uniform(x, cnt, 170, -2, 2);
        test_fill_uniform(dy, cnt, 171, -1, 1);
        test_fill_uniform(g, c, 172, 0.5f, 1.5f);
        test_fill_uniform(be, c, 173, -0.5f, 0.5f);
        float *o[2][10];
        int64_t len[10] = {c, c, c, c, cnt, cnt, cnt, c, c, cnt};
        for (int run = 0; run < 2; run++) {
            cpu_threads_set(run ? 3 : 1);
            for (int i = 0; i < 10; i++) {
                o[run][i] = malloc(4 * len[i]);
                test_fill_uniform(o[run][i], len[i], 180 + i, -1, 1); /* running stats, accumulated grads */
            }
            /* 0,1 running mean/var  2,3 save mean/invstd  4 y  5 dx  6 dx (accumulate)  7,8 dγ dβ  9 relu */
            ref_bn_forward_train_f32(n, c, hw, x, g, be, o[run][0], o[run][1], 0.1f, 1e-5f, o[run][2], o[run][3],
                                     o[run][4]);
            ref_bn_backward_f32(n, c, hw, x, dy, g, o[run][2], o[run][3], 1e-5f, o[run][5], o[run][7], o[run][8], 0);
            ref_bn_backward_f32(n, c, hw, x, dy, g, o[run][2], o[run][3], 1e-5f, o[run][6], o[run][7], o[run][8], 1);
            ref_relu_forward_f32(cnt, o[run][4], o[run][4]);
            ref_relu_backward_f32(cnt, o[run][4], dy, o[run][9], 0);
            ref_relu_backward_f32(cnt, o[run][4], dy, o[run][9], 1);
        }
        for (int i = 0; i < 10; i++) {
            ck_assert_msg(!memcmp(o[0][i], o[1][i], 4 * len[i]), "shape %zu: output %d differs on 3 threads", k, i);
            free(o[0][i]), free(o[1][i]);
        }
        free(x), free(dy), free(g), free(be);
    }
    cpu_threads_set(1);
}
END_TEST

Suite *suite_ops_ref(void) {
    Suite *s = suite_create("ops_ref");
    TCase *tc = tcase_create("ops_ref");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_conv_matches_naive);
    tcase_add_test(tc, test_conv_gradcheck);
    tcase_add_test(tc, test_conv_accumulate);
    tcase_add_test(tc, test_bn_train_forward_and_gradcheck);
    tcase_add_test(tc, test_bn_running_stats_by_hand);
    tcase_add_test(tc, test_bn_eval_formula);
    tcase_add_test(tc, test_bn_backward_accumulate);
    tcase_add_test(tc, test_relu);
    tcase_add_test(tc, test_add_and_grad_pass);
    tcase_add_test(tc, test_scale_and_add_inplace);
    tcase_add_test(tc, test_avgpool);
    tcase_add_test(tc, test_linear_forward_matches_naive);
    tcase_add_test(tc, test_linear_gradcheck_and_accumulate);
    tcase_add_test(tc, test_xent_gradcheck);
    tcase_add_test(tc, test_xent_by_hand);
    tcase_add_test(tc, test_xent_nan_is_the_maximum);
    tcase_add_test(tc, test_sgd_by_hand);
    tcase_add_test(tc, test_optimizer_sgd_steps_by_hand);
    tcase_add_test(tc, test_f32_agrees_with_f64);
    tcase_add_test(tc, test_conv_threads);
    tcase_add_test(tc, test_cpu_parallel_for_covers_once);
    tcase_add_test(tc, test_cpu_threads_auto);
    tcase_add_test(tc, test_conv_same_bits_any_thread_count);
    tcase_add_test(tc, test_bn_relu_same_bits_any_thread_count);
    suite_add_tcase(s, tc);
    return s;
}
