/* kernels.h — our own CUDA kernels (kernels.cu), callable from C.
 *
 * Everything cuDNN and cuBLAS do not cover: elementwise ops, pooling, the linear layer's bias, the
 * fused softmax + cross-entropy and the SGD update. Each launcher enqueues on `stream` and returns
 * at once; the caller checks the launch with CHECK_LAUNCH() (device.h) right after, so a failure
 * names the op in ops_cuda.c that issued it. A count of 0 launches nothing.
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

#ifdef __cplusplus
}
#endif

#endif
