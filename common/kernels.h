/* kernels.h — our own CUDA kernels (kernels.cu), callable from C.
 *
 * Everything we do not hand to cuDNN or cuBLAS: batch norm (fp32 and 16-bit, with a fused ReLU),
 * elementwise ops, pooling, the casts of mixed precision, the linear layer's bias, the fused
 * softmax + cross-entropy, the SGD update, the GradScaler's kernels and gradient clipping's. Each
 * launcher enqueues on `stream` and returns at once; the caller checks the launch with CHECK_LAUNCH()
 * (device.h) right after, so a failure names the op in ops_cuda.c that issued it. A count of 0
 * launches nothing, except where a result must still be written: the loss (*loss, *correct) and
 * clip_norm_coef (*norm, *coef).
 * Semantics are those of ops.h (dx overwrites when accumulate == 0, adds when accumulate == 1). */
#ifndef KERNELS_H
#define KERNELS_H

#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

void launch_relu_forward(cudaStream_t s, int64_t count, const float *x, float *y);
void launch_relu_backward(cudaStream_t s, int64_t count, const float *y, const float *dy, float *dx,
                          int accumulate);
void launch_add_forward(cudaStream_t s, int64_t count, const float *a, const float *b, float *y);
void launch_grad_pass(cudaStream_t s, int64_t count, const float *src, float *dst, int accumulate);
void launch_scale_inplace(cudaStream_t s, int64_t count, float *x, float alpha);
void launch_add_inplace(cudaStream_t s, int64_t count, const float *x, float *y);

/* [n][c][hw] → [n][c] mean, and its backward (dx[i] = dy[i / hw] / hw). */
void launch_avgpool_forward(cudaStream_t s, int n, int c, int hw, const float *x, float *y);
void launch_avgpool_backward(cudaStream_t s, int n, int c, int hw, const float *dy, float *dx,
                             int accumulate);

/* y[n][out] += b[out] (broadcast over rows), and db[out] += Σ_rows dy[row][out]. */
void launch_bias_add(cudaStream_t s, int n, int out, const float *b, float *y);
void launch_bias_grad(cudaStream_t s, int n, int out, const float *dy, float *db);

/* Fused softmax + cross-entropy, see ops.h. One block: deterministic, no float atomics. */
void launch_xent_forward_backward(cudaStream_t s, int n, int classes, const float *logits,
                                  const int32_t *labels, float scale, float *loss, int32_t *correct,
                                  float *dlogits);

/* PyTorch SGD over a flat buffer; momentum_buf is not touched (may be NULL) when momentum == 0. */
void launch_sgd_step(cudaStream_t s, int64_t count, float *params, const float *grads,
                     float *momentum_buf, float lr, float momentum, float weight_decay, int first);

/* The same with a device flag: nothing is written when *skip != 0 (skip may be NULL). */
void launch_sgd_step_unless(cudaStream_t s, int64_t count, float *params, const float *grads,
                            float *momentum_buf, float lr, float momentum, float weight_decay,
                            int first, const float *skip);

/* ---- typed (ops.h's *_lp ops): p = 0 fp32, 1 fp16 (__half), 2 bf16 (__nv_bfloat16); arithmetic
 * is fp32, 16-bit stores round to nearest even. fp32 runs here for channels-last (NHWC) models. */
void launch_cast_to(cudaStream_t s, int p, int64_t count, const float *src, void *dst);
void launch_cast_add_clear(cudaStream_t s, int p, int64_t count, void *src, float *dst);
void launch_cast_from(cudaStream_t s, int p, int64_t count, const void *src, float *dst);
/* x = round_p(x · alpha) in place, the product in fp32: precision_scale_stored on the device. */
void launch_scale_lp(cudaStream_t s, int p, int64_t count, void *x, float alpha);
void launch_relu_forward_lp(cudaStream_t s, int p, int64_t count, const void *x, void *y);
void launch_relu_backward_lp(cudaStream_t s, int p, int64_t count, const void *y, const void *dy,
                             void *dx, int accumulate);
void launch_add_forward_lp(cudaStream_t s, int p, int64_t count, const void *a, const void *b,
                           void *y);
void launch_grad_pass_lp(cudaStream_t s, int p, int64_t count, const void *src, void *dst,
                         int accumulate);
/* y = max(0, a + b); backward: g = dy·(y > 0) written (or added: acc) into da and db. */
void launch_add_relu_forward(cudaStream_t s, int p, int64_t count, const void *a, const void *b,
                             void *y);
void launch_add_relu_backward(cudaStream_t s, int p, int64_t count, const void *y, const void *dy,
                              void *da, int acc_a, void *db, int acc_b);
/* nhwc: the 16-bit tensors are channels-last, [n][hw][c] (ops.h). */
void launch_avgpool_forward_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                               void *y);
void launch_avgpool_backward_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw,
                                const void *dy, void *dx, int accumulate);
/* fp32 [n][c][hw] → p [n][hw][c]: the input batch of a channels-last model. */
void launch_cast_to_nhwc(cudaStream_t s, int p, int n, int c, int hw, const float *src, void *dst);
/* y[row][o] = b[o] (before a GEMM adds into it), and db[o] = Σ_rows dy (overwritten). */
void launch_bias_fill_lp(cudaStream_t s, int p, int n, int out, const void *b, void *y);
void launch_bias_grad_lp(cudaStream_t s, int p, int n, int out, const void *dy, void *db);
/* Batch norm, NCHW or NHWC, T activations with fp32 parameters and statistics, in three kernels
 * per pass (kernels.cu says why). relu = 1: the ReLU after it is fused (y is then the fused
 * output, whose sign masks the gradient). scratch: launch_bn_scratch_floats() device floats that
 * no other stream uses meanwhile. */
size_t launch_bn_scratch_floats(int nhwc, int n, int c, int hw);
/* SyncBatchNorm (ops.h's BnSync): between its partial sums and the rest, each pass writes this
 * rank's per-channel triples into its slot of buf (world · 3c floats), calls sum(ctx, buf, world · 3c)
 * from the host — the all-gather; the kernels after it wait for it — and merges the slots in rank
 * order. NULL: a plain batch norm. */
typedef struct BnExchange {
    void (*sum)(void *ctx, float *buf, int64_t count);
    void *ctx;
    int rank, world;
    float *buf;
} BnExchange;
void launch_bn_forward_train_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                                const float *gamma, const float *beta, float *running_mean,
                                float *running_var, float momentum, float eps, float *save_mean,
                                float *save_invstd, void *y, int relu, float *scratch,
                                const BnExchange *sync);
void launch_bn_forward_eval_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                               const float *gamma, const float *beta, const float *running_mean,
                               const float *running_var, float eps, void *y);
void launch_bn_backward_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                           const void *y, const void *dy, const float *gamma, const float *save_mean,
                           const float *save_invstd, void *dx, float *dgamma, float *dbeta,
                           int accumulate, int relu, float *scratch, const BnExchange *sync);

/* ---- GradScaler (ops.h): scalars in device memory ------------------------------------------- */
void launch_scale_by_device(cudaStream_t s, int64_t count, float *x, const float *alpha);
void launch_amp_unscale_check(cudaStream_t s, int64_t count, float *grads, const float *inv_scale,
                              float *found_inf);
void launch_amp_update_scale(cudaStream_t s, float *scale, float *inv_scale, int32_t *tracker,
                             float *found_inf, int64_t *skipped, double growth, double backoff,
                             int interval);
void launch_count_zero_nonfinite(cudaStream_t s, int64_t count, const float *x, int64_t *counts);

/* ---- gradient clipping (ops.h: clip_norm_coef; parts = CLIP_PARTS, the doubles in partials) ---- */
void launch_clip_norm_coef(cudaStream_t s, int64_t count, const float *g, double *partials, int parts,
                           float max_norm, float *norm, float *coef, int64_t *clipped);

#ifdef __cplusplus
}
#endif

#endif
