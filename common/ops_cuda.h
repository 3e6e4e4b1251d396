/* ops_cuda.h — the CUDA backend of ops.h: cuDNN (convolution), cuBLAS (linear) and our kernels
 * (kernels.cu) for batch norm and everything else. Called only through the dispatcher in ops.c, with
 * exactly the semantics documented in ops.h. Exists only in a CUDA build. */
#ifndef OPS_CUDA_H
#define OPS_CUDA_H

#ifdef USE_CUDA

#include <stdint.h>

#include "ops.h"

void cuda_conv_prepare(Device *d, Conv *c, int n);
void cuda_conv_release(Device *d, Conv *c);
size_t cuda_conv_workspace_bytes(Device *d, Conv *c, int n, int backward);
void cuda_conv_forward(Device *d, Conv *c, int n, const float *x, const float *w, float *y);
void cuda_conv_forward_plan(Device *d, Conv *c, int n, ConvFwdAlgo *a, const float *x,
                            const float *w, float *y);
void cuda_conv_backward_data(Device *d, Conv *c, int n, const float *dy, const float *w, float *dx,
                             int accumulate);
void cuda_conv_backward_filter(Device *d, Conv *c, int n, const float *x, const float *dy,
                               float *dw, int accumulate);

void cuda_bn_forward_train(Device *d, int n, int c, int hw, const float *x, const float *gamma,
                           const float *beta, float *running_mean, float *running_var,
                           float momentum, float eps, float *save_mean, float *save_invstd,
                           float *y);
void cuda_bn_forward_eval(Device *d, int n, int c, int hw, const float *x, const float *gamma,
                          const float *beta, const float *running_mean, const float *running_var,
                          float eps, float *y);
void cuda_bn_backward(Device *d, int n, int c, int hw, const float *x, const float *dy,
                      const float *gamma, const float *save_mean, const float *save_invstd,
                      float eps, float *dx, float *dgamma, float *dbeta, int accumulate);

void cuda_relu_forward(Device *d, int64_t count, const float *x, float *y);
void cuda_relu_backward(Device *d, int64_t count, const float *y, const float *dy, float *dx,
                        int accumulate);
void cuda_add_forward(Device *d, int64_t count, const float *a, const float *b, float *y);
void cuda_grad_pass(Device *d, int64_t count, const float *src, float *dst, int accumulate);

void cuda_avgpool_forward(Device *d, int n, int c, int hw, const float *x, float *y);
void cuda_avgpool_backward(Device *d, int n, int c, int hw, const float *dy, float *dx,
                           int accumulate);

void cuda_linear_forward(Device *d, int n, int in, int out, const float *x, const float *W,
                         const float *b, float *y);
void cuda_linear_backward(Device *d, int n, int in, int out, const float *x, const float *W,
                          const float *dy, float *dx, float *dW, float *db, int accumulate);

void cuda_xent_forward_backward(Device *d, int n, int classes, const float *logits,
                                const int32_t *labels, float scale, float *loss, int32_t *correct,
                                float *dlogits);

void cuda_sgd_step(Device *d, int64_t count, float *params, const float *grads,
                   float *momentum_buf, float lr, float momentum, float weight_decay, int first);

void cuda_scale_inplace(Device *d, int64_t count, float *x, float alpha);
void cuda_add_inplace(Device *d, int64_t count, const float *x, float *y);

/* mixed precision (ops.h): conv forward / backward-data above serve 16-bit plans too */
void cuda_conv_backward_filter_lp(Device *d, Conv *c, int n, const void *x, const void *dy,
                                  void *dw);
void cuda_cast_to(Device *d, Precision p, int64_t count, const float *src, void *dst);
void cuda_cast_add_clear(Device *d, Precision p, int64_t count, void *src, float *dst);
void cuda_cast_from(Device *d, Precision p, int64_t count, const void *src, float *dst);
void cuda_cast_to_nhwc(Device *d, Precision p, int n, int c, int hw, const float *src, void *dst);
void cuda_bn_prepare(Device *d, int nhwc, int n, int c, int hw);
void cuda_bn_forward_train_lp(Device *d, Precision p, int nhwc, int n, int c, int hw, const void *x,
                              const float *gamma, const float *beta, float *running_mean,
                              float *running_var, float momentum, float eps, float *save_mean,
                              float *save_invstd, void *y, int relu, const BnSync *sync);
void cuda_bn_forward_eval_lp(Device *d, Precision p, int nhwc, int n, int c, int hw, const void *x,
                             const float *gamma, const float *beta, const float *running_mean,
                             const float *running_var, float eps, void *y);
void cuda_bn_backward_lp(Device *d, Precision p, int nhwc, int n, int c, int hw, const void *x,
                         const void *y, const void *dy, const float *gamma, const float *save_mean,
                         const float *save_invstd, float eps, void *dx, float *dgamma,
                         float *dbeta, int accumulate, int relu, const BnSync *sync);
void cuda_relu_forward_lp(Device *d, Precision p, int64_t count, const void *x, void *y);
void cuda_relu_backward_lp(Device *d, Precision p, int64_t count, const void *y, const void *dy,
                           void *dx, int accumulate);
void cuda_add_relu_forward_lp(Device *d, Precision p, int64_t count, const void *a, const void *b,
                              void *y);
void cuda_add_relu_backward_lp(Device *d, Precision p, int64_t count, const void *y, const void *dy,
                               void *da, int acc_a, void *db, int acc_b);
void cuda_add_forward_lp(Device *d, Precision p, int64_t count, const void *a, const void *b,
                         void *y);
void cuda_grad_pass_lp(Device *d, Precision p, int64_t count, const void *src, void *dst,
                       int accumulate);
void cuda_avgpool_forward_lp(Device *d, Precision p, int nhwc, int n, int c, int hw, const void *x,
                             void *y);
void cuda_avgpool_backward_lp(Device *d, Precision p, int nhwc, int n, int c, int hw,
                              const void *dy, void *dx, int accumulate);
void cuda_linear_forward_lp(Device *d, Precision p, int n, int in, int out, const void *x,
                            const void *W, const void *b, void *y);
void cuda_linear_backward_lp(Device *d, Precision p, int n, int in, int out, const void *x,
                             const void *W, const void *dy, void *dx, void *dW, void *db,
                             int accumulate);
void cuda_scale_by_device(Device *d, int64_t count, float *x, const float *alpha);
void cuda_amp_unscale_check(Device *d, int64_t count, float *grads, const float *inv_scale,
                            float *found_inf);
void cuda_amp_update_scale(Device *d, float *scale, float *inv_scale, int32_t *growth_tracker,
                           float *found_inf, int64_t *skipped, double growth_factor,
                           double backoff_factor, int growth_interval);
void cuda_sgd_step_unless(Device *d, int64_t count, float *params, const float *grads,
                          float *momentum_buf, float lr, float momentum, float weight_decay,
                          int first, const float *skip);
void cuda_count_zero_nonfinite(Device *d, int64_t count, const float *x, int64_t *counts);
void cuda_clip_norm_coef(Device *d, int64_t count, const float *g, double *partials, float max_norm,
                         float *norm, float *coef, int64_t *clipped);

#endif /* USE_CUDA */

#endif
