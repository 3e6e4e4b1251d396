/* ops_ref.h — the plain C reference of every op: the CPU backend, and the oracle for tests.
 *
 * Written once, generically, in ops_ref_impl.h, and instantiated twice by ops_ref.c: for float
 * (suffix _f32, what the CPU backend trains with) and double (suffix _f64, what the finite-difference
 * gradient checks use). Semantics are exactly those documented in ops.h; shapes are explicit here
 * because the reference has no plan to hold them. Convolutions, batch norm and ReLU run on the CPU
 * threads (cpu_threads.h), split so that every output keeps one fixed summation order: results are
 * reproducible bit for bit on any thread count; batch-norm statistics and softmax sums accumulate in
 * double. */
#ifndef OPS_REF_H
#define OPS_REF_H

#include <stdint.h>

#include "ops.h"

#define OPS_REF_DECLARE(T, S)                                                                      \
    void ref_conv_forward##S(const ConvShape *s, int n, const T *x, const T *w, T *y);             \
    void ref_conv_backward_data##S(const ConvShape *s, int n, const T *dy, const T *w, T *dx,      \
                                   int accumulate);                                                \
    void ref_conv_backward_filter##S(const ConvShape *s, int n, const T *x, const T *dy, T *dw,    \
                                     int accumulate);                                              \
    void ref_bn_forward_train##S(int n, int c, int hw, const T *x, const T *gamma, const T *beta,  \
                                 T *running_mean, T *running_var, T momentum, T eps, T *save_mean, \
                                 T *save_invstd, T *y);                                            \
    void ref_bn_forward_eval##S(int n, int c, int hw, const T *x, const T *gamma, const T *beta,   \
                                const T *running_mean, const T *running_var, T eps, T *y);         \
    void ref_bn_backward##S(int n, int c, int hw, const T *x, const T *dy, const T *gamma,         \
                            const T *save_mean, const T *save_invstd, T eps, T *dx, T *dgamma,     \
                            T *dbeta, int accumulate);                                             \
    void ref_relu_forward##S(int64_t count, const T *x, T *y);                                     \
    void ref_relu_backward##S(int64_t count, const T *y, const T *dy, T *dx, int accumulate);      \
    void ref_add_forward##S(int64_t count, const T *a, const T *b, T *y);                          \
    void ref_grad_pass##S(int64_t count, const T *src, T *dst, int accumulate);                    \
    void ref_avgpool_forward##S(int n, int c, int hw, const T *x, T *y);                           \
    void ref_avgpool_backward##S(int n, int c, int hw, const T *dy, T *dx, int accumulate);        \
    void ref_linear_forward##S(int n, int in, int out, const T *x, const T *W, const T *b, T *y);  \
    void ref_linear_backward##S(int n, int in, int out, const T *x, const T *W, const T *dy,       \
                                T *dx, T *dW, T *db, int accumulate);                              \
    void ref_xent_forward_backward##S(int n, int classes, const T *logits, const int32_t *labels,  \
                                      T scale, T *loss, int32_t *correct, T *dlogits);             \
    void ref_sgd_step##S(int64_t count, T *params, const T *grads, T *momentum_buf, T lr,          \
                         T momentum, T weight_decay, int first);                                   \
    void ref_scale_inplace##S(int64_t count, T *x, T alpha);                                       \
    void ref_add_inplace##S(int64_t count, const T *x, T *y);

OPS_REF_DECLARE(float, _f32)
OPS_REF_DECLARE(double, _f64)

/* The mixed-precision emulation (ops.h's *_lp ops on the CPU backend): p tensors are float arrays
 * holding p values; each op is the _f32 reference followed by rounding what it stores to p. */
void ref_cast_to_lp(Precision p, int64_t count, const float *src, float *dst);
void ref_cast_from_lp(int64_t count, const float *src, float *dst);
void ref_cast_add_clear_lp(int64_t count, float *src, float *dst);
void ref_conv_forward_lp(Precision p, const ConvShape *s, int n, const float *x, const float *w,
                         float *y);
void ref_conv_backward_data_lp(Precision p, const ConvShape *s, int n, const float *dy,
                               const float *w, float *dx, int accumulate);
void ref_conv_backward_filter_lp(Precision p, const ConvShape *s, int n, const float *x,
                                 const float *dy, float *dw);
void ref_bn_forward_train_lp(Precision p, int n, int c, int hw, const float *x, const float *gamma,
                             const float *beta, float *running_mean, float *running_var,
                             float momentum, float eps, float *save_mean, float *save_invstd,
                             float *y);
void ref_bn_forward_eval_lp(Precision p, int n, int c, int hw, const float *x, const float *gamma,
                            const float *beta, const float *running_mean, const float *running_var,
                            float eps, float *y);
void ref_bn_backward_lp(Precision p, int n, int c, int hw, const float *x, const float *dy,
                        const float *gamma, const float *save_mean, const float *save_invstd,
                        float eps, float *dx, float *dgamma, float *dbeta, int accumulate);
void ref_bn_backward_relu_lp(Precision p, int n, int c, int hw, const float *x, const float *y,
                             const float *dy, const float *gamma, const float *save_mean,
                             const float *save_invstd, float eps, float *dx, float *dgamma,
                             float *dbeta, int accumulate, int relu);
/* SyncBatchNorm (ops.h): relu = 1 fuses the ReLU after it, as the CUDA kernels do. */
void ref_bn_forward_train_sync(Precision p, int n, int c, int hw, const float *x, const float *gamma,
                               const float *beta, float *running_mean, float *running_var,
                               float momentum, float eps, float *save_mean, float *save_invstd,
                               float *y, int relu, const BnSync *s);
void ref_bn_backward_sync(Precision p, int n, int c, int hw, const float *x, const float *y,
                          const float *dy, const float *gamma, const float *save_mean,
                          const float *save_invstd, float *dx, float *dgamma, float *dbeta,
                          int accumulate, int relu, const BnSync *s);
void ref_add_relu_backward_lp(Precision p, int64_t count, const float *y, const float *dy, float *da,
                              int acc_a, float *db, int acc_b);
void ref_add_forward_lp(Precision p, int64_t count, const float *a, const float *b, float *y);
void ref_grad_pass_lp(Precision p, int64_t count, const float *src, float *dst, int accumulate);
void ref_relu_backward_lp(Precision p, int64_t count, const float *y, const float *dy, float *dx,
                          int accumulate);
void ref_avgpool_forward_lp(Precision p, int n, int c, int hw, const float *x, float *y);
void ref_avgpool_backward_lp(Precision p, int n, int c, int hw, const float *dy, float *dx,
                             int accumulate);
void ref_linear_forward_lp(Precision p, int n, int in, int out, const float *x, const float *W,
                           const float *b, float *y);
void ref_linear_backward_lp(Precision p, int n, int in, int out, const float *x, const float *W,
                            const float *dy, float *dx, float *dW, float *db, int accumulate);

/* GradScaler's device-side steps and the skipping SGD, on the host (ops.h). */
void ref_scale_by_device(int64_t count, float *x, const float *alpha);
void ref_amp_unscale_check(int64_t count, float *grads, const float *inv_scale, float *found_inf);
void ref_amp_update_scale(float *scale, float *inv_scale, int32_t *growth_tracker, float *found_inf,
                          int64_t *skipped, double growth_factor, double backoff_factor,
                          int growth_interval);
void ref_count_zero_nonfinite(int64_t count, const float *x, int64_t *counts);
/* ops.h's clip_norm_coef: the squares summed in double, in index order. */
void ref_clip_norm_coef(int64_t count, const float *g, float max_norm, float *norm, float *coef,
                        int64_t *clipped);

#endif
