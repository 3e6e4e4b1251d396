/* ops.c — the dispatcher: every op of ops.h sends DEV_CPU to the C reference (ops_ref.c) and
 * DEV_CUDA to the CUDA backend (ops_cuda.c). Nothing else happens here, so reading an op's
 * implementation means opening ops_ref_impl.h (the maths, plainly) or ops_cuda.c (the GPU way).
 *
 * Built without CUDA, the CUDA branch compiles away entirely and a DEV_CUDA device is an internal
 * error (device_init already refuses to create one). */
#include "ops.h"

#include "errors.h"
#include "ops_ref.h"
#ifdef USE_CUDA
#include "ops_cuda.h"
#endif

#ifdef USE_CUDA
#define DISPATCH(d, cpu_call, cuda_call)                                                           \
    do {                                                                                           \
        if ((d)->kind == DEV_CPU) cpu_call;                                                        \
        else cuda_call;                                                                            \
    } while (0)
#else
#define DISPATCH(d, cpu_call, cuda_call)                                                           \
    do {                                                                                           \
        if ((d)->kind == DEV_CPU) cpu_call;                                                        \
        else no_cuda(__FILE__, __LINE__, __func__);                                                \
    } while (0)

_Noreturn static void no_cuda(const char *file, int line, const char *op) {
    die_at(file, line, op, "this binary was built without CUDA",
           "rebuild with a CUDA toolkit (see `make help`) or run with --device cpu");
}
#endif

void conv_shape(ConvShape *s, int cin, int cout, int k, int stride, int pad, int h, int w) {
    ASSERT(cin > 0 && cout > 0 && k > 0 && stride > 0 && pad >= 0 && h > 0 && w > 0);
    s->cin = cin;
    s->cout = cout;
    s->k = k;
    s->stride = stride;
    s->pad = pad;
    s->h = h;
    s->w = w;
    s->hout = (h + 2 * pad - k) / stride + 1;
    s->wout = (w + 2 * pad - k) / stride + 1;
    ASSERT(s->hout > 0 && s->wout > 0); /* kernel larger than the padded input */
}

/* ---- convolution: the CPU reference needs no plan -------------------------------------------- */

void conv_prepare(Device *d, Conv *c, int n) { DISPATCH(d, (void)0, cuda_conv_prepare(d, c, n)); }

void conv_release(Device *d, Conv *c) { DISPATCH(d, (void)0, cuda_conv_release(d, c)); }

size_t conv_workspace_bytes(Device *d, Conv *c, int n, int backward) {
    size_t b = 0;
    DISPATCH(d, (void)0, b = cuda_conv_workspace_bytes(d, c, n, backward));
    return b;
}

void conv_forward(Device *d, Conv *c, int n, const float *x, const float *w, float *y) {
    DISPATCH(d, ref_conv_forward_f32(&c->s, n, x, w, y), cuda_conv_forward(d, c, n, x, w, y));
}

void conv_forward_plan(Device *d, Conv *c, int n, ConvFwdAlgo *a, const float *x, const float *w,
                       float *y) {
    if (d->kind == DEV_CPU && a->algo < 0) {
        *a = (ConvFwdAlgo){0};
        return;
    }
    DISPATCH(d, ref_conv_forward_f32(&c->s, n, x, w, y), cuda_conv_forward_plan(d, c, n, a, x, w, y));
}

void conv_backward_data(Device *d, Conv *c, int n, const float *dy, const float *w, float *dx,
                        int accumulate) {
    DISPATCH(d, ref_conv_backward_data_f32(&c->s, n, dy, w, dx, accumulate),
             cuda_conv_backward_data(d, c, n, dy, w, dx, accumulate));
}

void conv_backward_filter(Device *d, Conv *c, int n, const float *x, const float *dy, float *dw,
                          int accumulate) {
    DISPATCH(d, ref_conv_backward_filter_f32(&c->s, n, x, dy, dw, accumulate),
             cuda_conv_backward_filter(d, c, n, x, dy, dw, accumulate));
}

/* ---- batch norm ------------------------------------------------------------------------------ */

void bn_forward_train(Device *d, int n, int c, int hw, const float *x, const float *gamma,
                      const float *beta, float *running_mean, float *running_var, float momentum,
                      float eps, float *save_mean, float *save_invstd, float *y) {
    DISPATCH(d,
             ref_bn_forward_train_f32(n, c, hw, x, gamma, beta, running_mean, running_var,
                                      momentum, eps, save_mean, save_invstd, y),
             cuda_bn_forward_train(d, n, c, hw, x, gamma, beta, running_mean, running_var,
                                   momentum, eps, save_mean, save_invstd, y));
}

void bn_forward_eval(Device *d, int n, int c, int hw, const float *x, const float *gamma,
                     const float *beta, const float *running_mean, const float *running_var,
                     float eps, float *y) {
    DISPATCH(d,
             ref_bn_forward_eval_f32(n, c, hw, x, gamma, beta, running_mean, running_var, eps, y),
             cuda_bn_forward_eval(d, n, c, hw, x, gamma, beta, running_mean, running_var, eps,
                                  y));
}

void bn_backward(Device *d, int n, int c, int hw, const float *x, const float *dy,
                 const float *gamma, const float *save_mean, const float *save_invstd, float eps,
                 float *dx, float *dgamma, float *dbeta, int accumulate) {
    DISPATCH(d,
             ref_bn_backward_f32(n, c, hw, x, dy, gamma, save_mean, save_invstd, eps, dx, dgamma,
                                 dbeta, accumulate),
             cuda_bn_backward(d, n, c, hw, x, dy, gamma, save_mean, save_invstd, eps, dx, dgamma,
                              dbeta, accumulate));
}

/* ---- elementwise ----------------------------------------------------------------------------- */

void relu_forward(Device *d, int64_t count, const float *x, float *y) {
    DISPATCH(d, ref_relu_forward_f32(count, x, y), cuda_relu_forward(d, count, x, y));
}

void relu_backward(Device *d, int64_t count, const float *y, const float *dy, float *dx,
                   int accumulate) {
    DISPATCH(d, ref_relu_backward_f32(count, y, dy, dx, accumulate),
             cuda_relu_backward(d, count, y, dy, dx, accumulate));
}

void add_forward(Device *d, int64_t count, const float *a, const float *b, float *y) {
    DISPATCH(d, ref_add_forward_f32(count, a, b, y), cuda_add_forward(d, count, a, b, y));
}

void grad_pass(Device *d, int64_t count, const float *src, float *dst, int accumulate) {
    DISPATCH(d, ref_grad_pass_f32(count, src, dst, accumulate),
             cuda_grad_pass(d, count, src, dst, accumulate));
}

/* ---- pooling, linear, loss ------------------------------------------------------------------- */

void avgpool_forward(Device *d, int n, int c, int hw, const float *x, float *y) {
    DISPATCH(d, ref_avgpool_forward_f32(n, c, hw, x, y), cuda_avgpool_forward(d, n, c, hw, x, y));
}

void avgpool_backward(Device *d, int n, int c, int hw, const float *dy, float *dx, int accumulate) {
    DISPATCH(d, ref_avgpool_backward_f32(n, c, hw, dy, dx, accumulate),
             cuda_avgpool_backward(d, n, c, hw, dy, dx, accumulate));
}

void linear_forward(Device *d, int n, int in, int out, const float *x, const float *W,
                    const float *b, float *y) {
    DISPATCH(d, ref_linear_forward_f32(n, in, out, x, W, b, y),
             cuda_linear_forward(d, n, in, out, x, W, b, y));
}

void linear_backward(Device *d, int n, int in, int out, const float *x, const float *W,
                     const float *dy, float *dx, float *dW, float *db, int accumulate) {
    DISPATCH(d, ref_linear_backward_f32(n, in, out, x, W, dy, dx, dW, db, accumulate),
             cuda_linear_backward(d, n, in, out, x, W, dy, dx, dW, db, accumulate));
}

void xent_forward_backward(Device *d, int n, int classes, const float *logits,
                           const int32_t *labels, float scale, float *loss, int32_t *correct,
                           float *dlogits) {
    DISPATCH(d,
             ref_xent_forward_backward_f32(n, classes, logits, labels, scale, loss, correct,
                                           dlogits),
             cuda_xent_forward_backward(d, n, classes, logits, labels, scale, loss, correct,
                                        dlogits));
}

/* ---- optimizer and helpers ------------------------------------------------------------------- */

void sgd_step(Device *d, int64_t count, float *params, const float *grads, float *momentum_buf,
              float lr, float momentum, float weight_decay, int first) {
    DISPATCH(d,
             ref_sgd_step_f32(count, params, grads, momentum_buf, lr, momentum, weight_decay,
                              first),
             cuda_sgd_step(d, count, params, grads, momentum_buf, lr, momentum, weight_decay,
                           first));
}

void scale_inplace(Device *d, int64_t count, float *x, float alpha) {
    DISPATCH(d, ref_scale_inplace_f32(count, x, alpha), cuda_scale_inplace(d, count, x, alpha));
}

void add_inplace(Device *d, int64_t count, const float *x, float *y) {
    DISPATCH(d, ref_add_inplace_f32(count, x, y), cuda_add_inplace(d, count, x, y));
}

/* ---- mixed precision: the CPU backend's emulation (ops_ref.c) or 16-bit CUDA ------------------ */

size_t precision_bytes(const Device *d, Precision p) {
    return (p == PREC_FP32 || d->kind == DEV_CPU) ? sizeof(float) : 2;
}

void cast_to(Device *d, Precision p, int64_t count, const float *src, void *dst) {
    DISPATCH(d, ref_cast_to_lp(p, count, src, dst), cuda_cast_to(d, p, count, src, dst));
}

void cast_from(Device *d, Precision p, int64_t count, const void *src, float *dst) {
    DISPATCH(d, ref_cast_from_lp(count, src, dst), cuda_cast_from(d, p, count, src, dst));
}

void cast_add_clear(Device *d, Precision p, int64_t count, void *src, float *dst) {
    DISPATCH(d, ref_cast_add_clear_lp(count, src, dst), cuda_cast_add_clear(d, p, count, src, dst));
}

/* Channels-last is a CUDA layout; the emulation is NCHW (see ops.h). */
static void cpu_is_nchw(int channels_last) {
    if (channels_last)
        die_at(__FILE__, __LINE__, "channels_last", "the CPU backend keeps NCHW",
               "pass channels_last = 0 on the CPU (the model does)");
}

void cast_to_nhwc(Device *d, Precision p, int n, int c, int hw, const float *src, void *dst) {
    DISPATCH(d, cpu_is_nchw(1), cuda_cast_to_nhwc(d, p, n, c, hw, src, dst));
}

void conv_forward_lp(Device *d, Conv *c, Precision p, int n, const void *x, const void *w, void *y) {
    ASSERT(c->prec == p);
    DISPATCH(d, ref_conv_forward_lp(p, &c->s, n, x, w, y), cuda_conv_forward(d, c, n, x, w, y));
}

void conv_backward_data_lp(Device *d, Conv *c, Precision p, int n, const void *dy, const void *w,
                           void *dx, int accumulate) {
    ASSERT(c->prec == p);
    DISPATCH(d, ref_conv_backward_data_lp(p, &c->s, n, dy, w, dx, accumulate),
             cuda_conv_backward_data(d, c, n, dy, w, dx, accumulate));
}

void conv_backward_filter_lp(Device *d, Conv *c, Precision p, int n, const void *x, const void *dy,
                             void *dw) {
    ASSERT(c->prec == p);
    DISPATCH(d, ref_conv_backward_filter_lp(p, &c->s, n, x, dy, dw),
             cuda_conv_backward_filter_lp(d, c, n, x, dy, dw));
}

void bn_prepare(Device *d, int channels_last, int n, int c, int hw) {
    DISPATCH(d, (void)0, cuda_bn_prepare(d, channels_last, n, c, hw));
}

/* The CPU's fused ReLU is the two ops in a row: rounding to p keeps signs, so the result is the
 * unfused one bit for bit. */
void bn_forward_train_lp(Device *d, Precision p, int channels_last, int n, int c, int hw,
                         const void *x, const float *gamma, const float *beta,
                         float *running_mean, float *running_var, float momentum, float eps,
                         float *save_mean, float *save_invstd, void *y, int relu) {
    DISPATCH(d,
             (cpu_is_nchw(channels_last),
              ref_bn_forward_train_lp(p, n, c, hw, x, gamma, beta, running_mean, running_var,
                                      momentum, eps, save_mean, save_invstd, y),
              relu ? ref_relu_forward_f32((int64_t)n * c * hw, y, y) : (void)0),
             cuda_bn_forward_train_lp(d, p, channels_last, n, c, hw, x, gamma, beta, running_mean,
                                      running_var, momentum, eps, save_mean, save_invstd, y, relu, NULL));
}


void bn_forward_eval_lp(Device *d, Precision p, int channels_last, int n, int c, int hw,
                        const void *x, const float *gamma, const float *beta,
                        const float *running_mean, const float *running_var, float eps, void *y) {
    DISPATCH(d,
             (cpu_is_nchw(channels_last),
              ref_bn_forward_eval_lp(p, n, c, hw, x, gamma, beta, running_mean, running_var, eps,
                                     y)),
             cuda_bn_forward_eval_lp(d, p, channels_last, n, c, hw, x, gamma, beta, running_mean,
                                     running_var, eps, y));
}

void bn_backward_lp(Device *d, Precision p, int channels_last, int n, int c, int hw, const void *x,
                    const void *y, const void *dy, const float *gamma, const float *save_mean,
                    const float *save_invstd, float eps, void *dx, float *dgamma, float *dbeta,
                    int accumulate, int relu) {
    DISPATCH(d,
             (cpu_is_nchw(channels_last),
              ref_bn_backward_relu_lp(p, n, c, hw, x, y, dy, gamma, save_mean, save_invstd, eps, dx,
                                 dgamma, dbeta, accumulate, relu)),
             cuda_bn_backward_lp(d, p, channels_last, n, c, hw, x, y, dy, gamma, save_mean,
                                 save_invstd, eps, dx, dgamma, dbeta, accumulate, relu, NULL));
}

void bn_forward_train_sync(Device *d, Precision p, int channels_last, int n, int c, int hw,
                           const void *x, const float *gamma, const float *beta,
                           float *running_mean, float *running_var, float momentum, float eps,
                           float *save_mean, float *save_invstd, void *y, int relu, const BnSync *s) {
    if (!s) {
        bn_forward_train_lp(d, p, channels_last, n, c, hw, x, gamma, beta, running_mean, running_var, momentum, eps,
                            save_mean, save_invstd, y, relu);
        return;
    }
    ASSERT(s->world >= 1 && s->rank >= 0 && s->rank < s->world);
    DISPATCH(d,
             (cpu_is_nchw(channels_last),
              ref_bn_forward_train_sync(p, n, c, hw, x, gamma, beta, running_mean, running_var, momentum,
                                        eps, save_mean, save_invstd, y, relu, s)),
             cuda_bn_forward_train_lp(d, p, channels_last, n, c, hw, x, gamma, beta, running_mean,
                                      running_var, momentum, eps, save_mean, save_invstd, y, relu, s));
}

void bn_backward_sync(Device *d, Precision p, int channels_last, int n, int c, int hw, const void *x,
                      const void *y, const void *dy, const float *gamma, const float *save_mean,
                      const float *save_invstd, float eps, void *dx, float *dgamma, float *dbeta,
                      int accumulate, int relu, const BnSync *s) {
    if (!s) {
        bn_backward_lp(d, p, channels_last, n, c, hw, x, y, dy, gamma, save_mean, save_invstd, eps, dx, dgamma, dbeta,
                       accumulate, relu);
        return;
    }
    ASSERT(s->world >= 1 && s->rank >= 0 && s->rank < s->world);
    DISPATCH(d,
             (cpu_is_nchw(channels_last),
              ref_bn_backward_sync(p, n, c, hw, x, y, dy, gamma, save_mean, save_invstd, dx, dgamma,
                                   dbeta, accumulate, relu, s)),
             cuda_bn_backward_lp(d, p, channels_last, n, c, hw, x, y, dy, gamma, save_mean,
                                 save_invstd, eps, dx, dgamma, dbeta, accumulate, relu, s));
}

void relu_forward_lp(Device *d, Precision p, int64_t count, const void *x, void *y) {
    DISPATCH(d, ref_relu_forward_f32(count, x, y), cuda_relu_forward_lp(d, p, count, x, y));
}

void relu_backward_lp(Device *d, Precision p, int64_t count, const void *y, const void *dy,
                      void *dx, int accumulate) {
    DISPATCH(d, ref_relu_backward_lp(p, count, y, dy, dx, accumulate),
             cuda_relu_backward_lp(d, p, count, y, dy, dx, accumulate));
}

void add_forward_lp(Device *d, Precision p, int64_t count, const void *a, const void *b, void *y) {
    DISPATCH(d, ref_add_forward_lp(p, count, a, b, y), cuda_add_forward_lp(d, p, count, a, b, y));
}

void add_relu_forward_lp(Device *d, Precision p, int64_t count, const void *a, const void *b, void *y) {
    DISPATCH(d, (ref_add_forward_lp(p, count, a, b, y), ref_relu_forward_f32(count, y, y)),
             cuda_add_relu_forward_lp(d, p, count, a, b, y));
}

void add_relu_backward_lp(Device *d, Precision p, int64_t count, const void *y, const void *dy,
                          void *da, int acc_a, void *db, int acc_b) {
    DISPATCH(d, ref_add_relu_backward_lp(p, count, y, dy, da, acc_a, db, acc_b),
             cuda_add_relu_backward_lp(d, p, count, y, dy, da, acc_a, db, acc_b));
}

void grad_pass_lp(Device *d, Precision p, int64_t count, const void *src, void *dst,
                  int accumulate) {
    DISPATCH(d, ref_grad_pass_lp(p, count, src, dst, accumulate),
             cuda_grad_pass_lp(d, p, count, src, dst, accumulate));
}

void avgpool_forward_lp(Device *d, Precision p, int channels_last, int n, int c, int hw,
                        const void *x, void *y) {
    DISPATCH(d, (cpu_is_nchw(channels_last), ref_avgpool_forward_lp(p, n, c, hw, x, y)),
             cuda_avgpool_forward_lp(d, p, channels_last, n, c, hw, x, y));
}

void avgpool_backward_lp(Device *d, Precision p, int channels_last, int n, int c, int hw,
                         const void *dy, void *dx, int accumulate) {
    DISPATCH(d, (cpu_is_nchw(channels_last), ref_avgpool_backward_lp(p, n, c, hw, dy, dx, accumulate)),
             cuda_avgpool_backward_lp(d, p, channels_last, n, c, hw, dy, dx, accumulate));
}

void linear_forward_lp(Device *d, Precision p, int n, int in, int out, const void *x,
                       const void *W, const void *b, void *y) {
    DISPATCH(d, ref_linear_forward_lp(p, n, in, out, x, W, b, y),
             cuda_linear_forward_lp(d, p, n, in, out, x, W, b, y));
}

void linear_backward_lp(Device *d, Precision p, int n, int in, int out, const void *x,
                        const void *W, const void *dy, void *dx, void *dW, void *db,
                        int accumulate) {
    DISPATCH(d, ref_linear_backward_lp(p, n, in, out, x, W, dy, dx, dW, db, accumulate),
             cuda_linear_backward_lp(d, p, n, in, out, x, W, dy, dx, dW, db, accumulate));
}

/* ---- GradScaler's device side ---------------------------------------------------------------- */

void scale_by_device(Device *d, int64_t count, float *x, const float *alpha) {
    DISPATCH(d, ref_scale_by_device(count, x, alpha), cuda_scale_by_device(d, count, x, alpha));
}

void amp_unscale_check(Device *d, int64_t count, float *grads, const float *inv_scale,
                       float *found_inf) {
    DISPATCH(d, ref_amp_unscale_check(count, grads, inv_scale, found_inf),
             cuda_amp_unscale_check(d, count, grads, inv_scale, found_inf));
}

void amp_update_scale(Device *d, float *scale, float *inv_scale, int32_t *growth_tracker,
                      float *found_inf, int64_t *skipped, double growth_factor,
                      double backoff_factor, int growth_interval) {
    DISPATCH(d,
             ref_amp_update_scale(scale, inv_scale, growth_tracker, found_inf, skipped,
                                  growth_factor, backoff_factor, growth_interval),
             cuda_amp_update_scale(d, scale, inv_scale, growth_tracker, found_inf, skipped,
                                   growth_factor, backoff_factor, growth_interval));
}

static void ref_sgd_step_unless(int64_t count, float *params, const float *grads,
                                float *momentum_buf, float lr, float momentum, float weight_decay,
                                int first, const float *skip) {
    if (*skip == 0.0f)
        ref_sgd_step_f32(count, params, grads, momentum_buf, lr, momentum, weight_decay, first);
}

void sgd_step_unless(Device *d, int64_t count, float *params, const float *grads,
                     float *momentum_buf, float lr, float momentum, float weight_decay, int first,
                     const float *skip) {
    DISPATCH(d,
             ref_sgd_step_unless(count, params, grads, momentum_buf, lr, momentum, weight_decay,
                                 first, skip),
             cuda_sgd_step_unless(d, count, params, grads, momentum_buf, lr, momentum,
                                  weight_decay, first, skip));
}

void count_zero_nonfinite(Device *d, int64_t count, const float *x, int64_t *counts) {
    DISPATCH(d, ref_count_zero_nonfinite(count, x, counts),
             cuda_count_zero_nonfinite(d, count, x, counts));
}

void clip_norm_coef(Device *d, int64_t count, const float *g, double *partials, float max_norm,
                    float *norm, float *coef, int64_t *clipped) {
    DISPATCH(d, ref_clip_norm_coef(count, g, max_norm, norm, coef, clipped),
             cuda_clip_norm_coef(d, count, g, partials, max_norm, norm, coef, clipped));
}
