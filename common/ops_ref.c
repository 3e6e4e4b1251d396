/* ops_ref.c — the plain C reference ops (see ops_ref.h), stamped out twice from ops_ref_impl.h:
 * float (_f32) is the CPU backend the trainer runs; double (_f64) is what the finite-difference
 * gradient checks in tests/test_ops_ref.c use, where float's rounding would swamp the check.
 * Below them: the mixed-precision emulation (the _lp ops: _f32 + rounding where the GPU stores a
 * 16-bit value) and the GradScaler's scalar steps. */
#include "ops_ref.h"

#define T float
#define S _f32
#include "ops_ref_impl.h"
#undef T
#undef S

#define T double
#define S _f64
#include "ops_ref_impl.h"
#undef T
#undef S

/* ================================================================================================
 * Mixed-precision emulation. Each p tensor is a float array of p values. The GPU computes in fp32
 * and rounds each stored result once; so do we: run the fp32 reference, round what it stored.
 * ============================================================================================== */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

#define ROUND(p, n, x) precision_round_array((p), (int64_t)(n), (x))

void ref_cast_to_lp(Precision p, int64_t count, const float *src, float *dst) {
    if (dst != src) memmove(dst, src, (size_t)count * sizeof(float));
    ROUND(p, count, dst);
}

void ref_cast_from_lp(int64_t count, const float *src, float *dst) {
    ref_grad_pass_f32(count, src, dst, 0); /* widening is exact */
}

void ref_cast_add_clear_lp(int64_t count, float *src, float *dst) {
    for (int64_t i = 0; i < count; i++) {
        if (src[i] != 0.f) dst[i] += src[i]; /* a zero adds nothing, not even its sign */
        src[i] = 0.f;
    }
}

void ref_conv_forward_lp(Precision p, const ConvShape *s, int n, const float *x, const float *w,
                         float *y) {
    ref_conv_forward_f32(s, n, x, w, y);
    ROUND(p, (int64_t)n * s->cout * s->hout * s->wout, y);
}

/* accumulate: the reference adds into dx in fp32, then one rounding: round(old + new). */
void ref_conv_backward_data_lp(Precision p, const ConvShape *s, int n, const float *dy,
                               const float *w, float *dx, int accumulate) {
    ref_conv_backward_data_f32(s, n, dy, w, dx, accumulate);
    ROUND(p, (int64_t)n * s->cin * s->h * s->w, dx);
}

void ref_conv_backward_filter_lp(Precision p, const ConvShape *s, int n, const float *x,
                                 const float *dy, float *dw) {
    int64_t count = (int64_t)s->cout * s->cin * s->k * s->k;
    ref_conv_backward_filter_f32(s, n, x, dy, dw, 0); /* a fresh p gradient, not an accumulation */
    ROUND(p, count, dw);
}

void ref_bn_forward_train_lp(Precision p, int n, int c, int hw, const float *x, const float *gamma,
                             const float *beta, float *running_mean, float *running_var,
                             float momentum, float eps, float *save_mean, float *save_invstd,
                             float *y) {
    ref_bn_forward_train_f32(n, c, hw, x, gamma, beta, running_mean, running_var, momentum, eps,
                             save_mean, save_invstd, y);
    ROUND(p, (int64_t)n * c * hw, y);
}

void ref_bn_forward_eval_lp(Precision p, int n, int c, int hw, const float *x, const float *gamma,
                            const float *beta, const float *running_mean, const float *running_var,
                            float eps, float *y) {
    ref_bn_forward_eval_f32(n, c, hw, x, gamma, beta, running_mean, running_var, eps, y);
    ROUND(p, (int64_t)n * c * hw, y);
}

void ref_bn_backward_lp(Precision p, int n, int c, int hw, const float *x, const float *dy,
                        const float *gamma, const float *save_mean, const float *save_invstd,
                        float eps, float *dx, float *dgamma, float *dbeta, int accumulate) {
    ref_bn_backward_f32(n, c, hw, x, dy, gamma, save_mean, save_invstd, eps, dx, dgamma, dbeta,
                        accumulate);
    ROUND(p, (int64_t)n * c * hw, dx);
}

/* bn_backward_lp with a fused ReLU: dy masked by the fused output y first (relu = 0: plain). */
void ref_bn_backward_relu_lp(Precision p, int n, int c, int hw, const float *x, const float *y,
                             const float *dy, const float *gamma, const float *save_mean,
                             const float *save_invstd, float eps, float *dx, float *dgamma,
                             float *dbeta, int accumulate, int relu) {
    float *masked = NULL;
    if (relu) {
        int64_t count = (int64_t)n * c * hw;
        masked = xmalloc((size_t)count * sizeof(float));
        ref_relu_backward_f32(count, y, dy, masked, 0);
    }
    ref_bn_backward_lp(p, n, c, hw, x, relu ? masked : dy, gamma, save_mean, save_invstd, eps, dx,
                       dgamma, dbeta, accumulate);
    free(masked);
}

/* ---- SyncBatchNorm (ops.h): the CPU backend's, and the oracle of the CUDA kernels' ---------------
 * The same exchange as the GPU's — each rank's per-channel triple in float, summed over the ranks
 * into an all-gather — with this reference's double arithmetic on either side of it. */

/* Channel ch of an NCHW tensor, visited image by image. */
#define BN_EACH(n, c, hw, ch, off, BODY)                                                           \
    for (int i_ = 0; i_ < (n); i_++)                                                               \
        for (int64_t off = ((int64_t)i_ * (c) + (ch)) * (hw), e_ = off + (hw); off < e_; off++) BODY

static float *exchange_slot(const BnSync *s, int c) {
    memset(s->buf, 0, (size_t)s->world * 3 * (size_t)c * sizeof(float));
    return s->buf + (size_t)s->rank * 3 * (size_t)c;
}

void ref_bn_forward_train_sync(Precision p, int n, int c, int hw, const float *x, const float *gamma,
                               const float *beta, float *running_mean, float *running_var,
                               float momentum, float eps, float *save_mean, float *save_invstd,
                               float *y, int relu, const BnSync *s) {
    const double rows = (double)n * hw;
    float *mine = exchange_slot(s, c);
    for (int ch = 0; ch < c; ch++) { /* this rank's count, mean and M2, two passes */
        double sum = 0, m2 = 0;
        BN_EACH(n, c, hw, ch, o, { sum += x[o]; });
        const double mean = sum / rows;
        BN_EACH(n, c, hw, ch, o, { m2 += ((double)x[o] - mean) * ((double)x[o] - mean); });
        mine[3 * ch] = (float)rows, mine[3 * ch + 1] = (float)mean, mine[3 * ch + 2] = (float)m2;
    }
    s->sum(s->ctx, s->buf, (int64_t)s->world * 3 * c);
    for (int ch = 0; ch < c; ch++) {
        double N = 0, mean = 0, m2 = 0; /* Chan et al., rank by rank */
        for (int r = 0; r < s->world; r++) {
            const float *t = s->buf + ((size_t)r * c + ch) * 3;
            double nb = t[0], delta = (double)t[1] - mean;
            if (nb == 0) continue;
            mean += delta * nb / (N + nb);
            m2 += (double)t[2] + delta * delta * N * nb / (N + nb);
            N += nb;
        }
        ASSERT(N > 1); /* the unbiased variance divides by N − 1 */
        const double var = m2 / N, invstd = 1.0 / sqrt(var + (double)eps), mo = (double)momentum;
        running_mean[ch] = (float)((1.0 - mo) * (double)running_mean[ch] + mo * mean);
        running_var[ch] = (float)((1.0 - mo) * (double)running_var[ch] + mo * m2 / (N - 1));
        save_mean[ch] = (float)mean, save_invstd[ch] = (float)invstd;
        const float mu = (float)mean, scale = (float)(invstd * (double)gamma[ch]), shift = beta[ch];
        BN_EACH(n, c, hw, ch, o, {
            float v = (x[o] - mu) * scale + shift;
            y[o] = relu && v < 0.f ? 0.f : v;
        });
    }
    ROUND(p, (int64_t)n * c * hw, y);
}

void ref_bn_backward_sync(Precision p, int n, int c, int hw, const float *x, const float *y,
                          const float *dy, const float *gamma, const float *save_mean,
                          const float *save_invstd, float *dx, float *dgamma, float *dbeta,
                          int accumulate, int relu, const BnSync *s) {
#define G(o) (relu && !(y[o] > 0.f) ? 0.0 : (double)dy[o]) /* the fused ReLU's mask first */
    float *mine = exchange_slot(s, c);
    for (int ch = 0; ch < c; ch++) { /* this rank's count, Σ g and Σ g·x̂ */
        const double mean = save_mean[ch], invstd = save_invstd[ch];
        double sdy = 0, sdyx = 0;
        BN_EACH(n, c, hw, ch, o, {
            sdy += G(o);
            sdyx += G(o) * (((double)x[o] - mean) * invstd);
        });
        dbeta[ch] = (float)((double)dbeta[ch] + sdy); /* this rank's, as PyTorch's SyncBatchNorm */
        dgamma[ch] = (float)((double)dgamma[ch] + sdyx);
        mine[3 * ch] = (float)((double)n * hw), mine[3 * ch + 1] = (float)sdy, mine[3 * ch + 2] = (float)sdyx;
    }
    s->sum(s->ctx, s->buf, (int64_t)s->world * 3 * c);
    for (int ch = 0; ch < c; ch++) {
        double N = 0, sdy = 0, sdyx = 0;
        for (int r = 0; r < s->world; r++) {
            const float *t = s->buf + ((size_t)r * c + ch) * 3;
            N += t[0], sdy += t[1], sdyx += t[2];
        }
        const double mean = save_mean[ch], invstd = save_invstd[ch], k = (double)gamma[ch] * invstd;
        const double mdy = sdy / N, mdyx = sdyx / N;
        BN_EACH(n, c, hw, ch, o, {
            const double xhat = ((double)x[o] - mean) * invstd;
            const float g = (float)(k * (G(o) - mdy - xhat * mdyx));
            dx[o] = accumulate ? dx[o] + g : g;
        });
    }
    ROUND(p, (int64_t)n * c * hw, dx);
#undef G
}

/* The end of a residual block backward: ReLU's mask, then the add's two gradient copies. */
void ref_add_relu_backward_lp(Precision p, int64_t count, const float *y, const float *dy, float *da,
                              int acc_a, float *db, int acc_b) {
    float *g = xmalloc((size_t)(count > 0 ? count : 1) * sizeof(float));
    ref_relu_backward_f32(count, y, dy, g, 0);
    ref_grad_pass_lp(p, count, g, da, acc_a);
    ref_grad_pass_lp(p, count, g, db, acc_b);
    free(g);
}

void ref_add_forward_lp(Precision p, int64_t count, const float *a, const float *b, float *y) {
    ref_add_forward_f32(count, a, b, y);
    ROUND(p, count, y);
}

void ref_grad_pass_lp(Precision p, int64_t count, const float *src, float *dst, int accumulate) {
    ref_grad_pass_f32(count, src, dst, accumulate);
    if (accumulate) ROUND(p, count, dst); /* a copy of p values is already exact */
}

void ref_relu_backward_lp(Precision p, int64_t count, const float *y, const float *dy, float *dx,
                          int accumulate) {
    ref_relu_backward_f32(count, y, dy, dx, accumulate);
    if (accumulate) ROUND(p, count, dx);
}

void ref_avgpool_forward_lp(Precision p, int n, int c, int hw, const float *x, float *y) {
    ref_avgpool_forward_f32(n, c, hw, x, y);
    ROUND(p, (int64_t)n * c, y);
}

void ref_avgpool_backward_lp(Precision p, int n, int c, int hw, const float *dy, float *dx,
                             int accumulate) {
    ref_avgpool_backward_f32(n, c, hw, dy, dx, accumulate);
    ROUND(p, (int64_t)n * c * hw, dx);
}

void ref_linear_forward_lp(Precision p, int n, int in, int out, const float *x, const float *W,
                           const float *b, float *y) {
    ref_linear_forward_f32(n, in, out, x, W, b, y); /* y = b + x·Wᵀ in fp32, then one rounding */
    ROUND(p, (int64_t)n * out, y);
}

void ref_linear_backward_lp(Precision p, int n, int in, int out, const float *x, const float *W,
                            const float *dy, float *dx, float *dW, float *db, int accumulate) {
    memset(dW, 0, (size_t)in * out * sizeof(float)); /* fresh p gradients */
    if (db) memset(db, 0, (size_t)out * sizeof(float));
    ref_linear_backward_f32(n, in, out, x, W, dy, dx, dW, db, accumulate);
    if (dx) ROUND(p, (int64_t)n * in, dx);
    ROUND(p, (int64_t)in * out, dW);
    if (db) ROUND(p, out, db);
}

/* ---- GradScaler ------------------------------------------------------------------------------- */

void ref_scale_by_device(int64_t count, float *x, const float *alpha) {
    ref_scale_inplace_f32(count, x, *alpha);
}

void ref_amp_unscale_check(int64_t count, float *grads, const float *inv_scale, float *found_inf) {
    float inv = *inv_scale;
    /* torch checks only the scaled gradient; a scale backed off past 1/FLT_MAX makes 1/scale inf, and
     * unscaling then writes inf/NaN that nothing flags. We flag it: the step is skipped, not NaN. */
    if (count > 0 && !isfinite(inv)) *found_inf = 1.0f;
    for (int64_t i = 0; i < count; i++) {
        if (!isfinite(grads[i])) *found_inf = 1.0f;
        grads[i] = inv == 1.0f ? grads[i] : grads[i] * inv;
    }
}

void ref_amp_update_scale(float *scale, float *inv_scale, int32_t *growth_tracker, float *found_inf,
                          int64_t *skipped, double growth_factor, double backoff_factor,
                          int growth_interval) {
    if (*found_inf != 0.0f) {
        *scale = (float)((double)*scale * backoff_factor); /* float·double in double, as torch */
        *growth_tracker = 0;
        ++*skipped;
    } else {
        int32_t successful = *growth_tracker + 1;
        if (successful == growth_interval) {
            float grown = (float)((double)*scale * growth_factor);
            if (isfinite(grown)) *scale = grown; /* never grow past fp32's range to inf */
            *growth_tracker = 0;
        } else {
            *growth_tracker = successful;
        }
    }
    *inv_scale = (float)(1.0 / (double)*scale);
    *found_inf = 0.0f;
}

void ref_count_zero_nonfinite(int64_t count, const float *x, int64_t *counts) {
    int64_t zero = 0, bad = 0;
    for (int64_t i = 0; i < count; i++) zero += x[i] == 0.0f, bad += !isfinite(x[i]);
    counts[0] += zero;
    counts[1] += bad;
}

void ref_clip_norm_coef(int64_t count, const float *g, float max_norm, float *norm, float *coef,
                        int64_t *clipped) {
    double s = 0.0;
    for (int64_t i = 0; i < count; i++) s += (double)g[i] * (double)g[i];
    /* torch sums the squares in fp32 (per tensor, then the norms' squares): past FLT_MAX its norm is
     * inf, so the coefficient is 0 and every gradient becomes 0 — a finite 2e19 is enough */
    const float n = s > FLT_MAX ? INFINITY : (float)sqrt(s);
    /* torch: max_norm / (total_norm + 1e-6) is Tensor.__rtruediv__ = reciprocal() * max_norm, in fp32;
     * clamp(max=1.0) lets a NaN through */
    float c = (1.0f / (n + 1e-6f)) * max_norm;
    if (c > 1.0f) c = 1.0f;
    *norm = n;
    *coef = c;
    if (c < 1.0f && isfinite(n)) *clipped += 1; /* an inf norm (a step the GradScaler skips) is not counted */
}
