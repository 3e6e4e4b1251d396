/* kernels.cu — the CUDA kernels that cuDNN/cuBLAS do not give us (see kernels.h).
 *
 * The mixed-precision kernels (second half) are templates over the 16-bit element type T (__half or
 * __nv_bfloat16): they load T, compute in fp32 and store T rounded to nearest even — the same
 * points at which the CPU backend's emulation rounds (ops_ref.c).
 *
 * Style: one thread per element in a grid-stride loop (so any count works with a bounded grid),
 * 256 threads per block, int64 indices (a flat parameter buffer may exceed 2^31 floats in
 * principle). Nothing here uses atomics on floats, so every result is bit-reproducible run to run:
 * reductions have one fixed summation order. */
#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels.h"

#define THREADS 256
/* Enough blocks to fill any current GPU several times over; the grid-stride loop does the rest. */
#define MAX_BLOCKS 8192

static int blocks_for(int64_t count) {
    int64_t b = (count + THREADS - 1) / THREADS;
    return (int)(b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

/* for (i = global thread id; i < count; i += total threads) */
#define GRID_STRIDE(i, count)                                                                      \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (count);                  \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- elementwise ----------------------------------------------------------------------------- */

__global__ void relu_forward_kernel(int64_t count, const float *x, float *y) {
    GRID_STRIDE(i, count) {
        float v = x[i];
        y[i] = v < 0.f ? 0.f : v; /* NaN passes through, as in PyTorch */
    }
}

/* y is ReLU's output: y > 0 exactly where the input was > 0, so ReLU may run in place. */
__global__ void relu_backward_kernel(int64_t count, const float *y, const float *dy, float *dx,
                                     int accumulate) {
    GRID_STRIDE(i, count) {
        float g = y[i] > 0.f ? dy[i] : 0.f;
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

__global__ void add_forward_kernel(int64_t count, const float *a, const float *b, float *y) {
    GRID_STRIDE(i, count) y[i] = a[i] + b[i];
}

__global__ void grad_pass_kernel(int64_t count, const float *src, float *dst, int accumulate) {
    GRID_STRIDE(i, count) dst[i] = accumulate ? dst[i] + src[i] : src[i];
}

__global__ void scale_inplace_kernel(int64_t count, float *x, float alpha) {
    GRID_STRIDE(i, count) x[i] *= alpha;
}

__global__ void add_inplace_kernel(int64_t count, const float *x, float *y) {
    GRID_STRIDE(i, count) y[i] += x[i];
}

/* ---- global average pool --------------------------------------------------------------------- */

/* One thread per (sample, channel) sums its hw contiguous values in order. hw is small in ResNet
 * (4×4 = 16 for CIFAR), so a per-thread loop is the simple and adequate choice. */
__global__ void avgpool_forward_kernel(int64_t rows, int hw, const float *x, float *y) {
    GRID_STRIDE(r, rows) {
        const float *p = x + r * hw;
        float s = 0.f;
        for (int j = 0; j < hw; j++) s += p[j];
        y[r] = s / (float)hw;
    }
}

__global__ void avgpool_backward_kernel(int64_t count, int hw, const float *dy, float *dx,
                                        int accumulate) {
    GRID_STRIDE(i, count) {
        float g = dy[i / hw] / (float)hw;
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

/* ---- linear layer bias ----------------------------------------------------------------------- */

__global__ void bias_add_kernel(int64_t count, int out, const float *b, float *y) {
    GRID_STRIDE(i, count) y[i] += b[i % out];
}

/* One thread per output column walks down the rows: neighbouring threads read neighbouring
 * addresses (coalesced), and the fixed row order makes the sum deterministic. */
__global__ void bias_grad_kernel(int n, int out, const float *dy, float *db) {
    GRID_STRIDE(o, out) {
        float s = 0.f;
        for (int r = 0; r < n; r++) s += dy[(int64_t)r * out + o];
        db[o] += s;
    }
}

/* ---- fused softmax + cross-entropy ----------------------------------------------------------- */

/* A single block of XENT_THREADS: warp w handles rows w, w + WARPS, w + 2·WARPS, ... Within a row
 * the 32 lanes stride over the classes (coalesced reads) and combine with butterfly shuffles, which
 * leave every lane holding the same bits. Lane 0 of each warp accumulates its rows' loss (in
 * double) and correct count in row order; thread 0 then adds the per-warp partials in warp order.
 * Fixed order everywhere → the same bits every run, with no scratch memory and no float atomics.
 * One block is plenty for a classifier head (n·classes is at most a few million): 1024 threads
 * rather than the usual 256, so that 32 warps share the rows. */
#define XENT_THREADS 1024
#define XENT_WARPS (XENT_THREADS / 32)

__global__ void __launch_bounds__(XENT_THREADS)
    xent_kernel(int n, int classes, const float *logits, const int32_t *labels, float scale,
                float *loss, int32_t *correct, float *dlogits) {
    __shared__ double warp_loss[XENT_WARPS];
    __shared__ int warp_correct[XENT_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned full = 0xffffffffu;
    double my_loss = 0.0; /* meaningful on lane 0 only */
    int my_correct = 0;

    for (int row = warp; row < n; row += XENT_WARPS) {
        const float *z = logits + (int64_t)row * classes;
        float *dz = dlogits + (int64_t)row * classes;

        /* 1. row maximum and its first index (argmax picks the first maximum, as torch.argmax) */
        float m = -INFINITY;
        int arg = -1;
        for (int j = lane; j < classes; j += 32) {
            float v = z[j];
            if (arg < 0 || v > m) { m = v; arg = j; }
        }
        for (int off = 16; off > 0; off >>= 1) {
            float om = __shfl_xor_sync(full, m, off);
            int oa = __shfl_xor_sync(full, arg, off);
            if (oa >= 0 && (arg < 0 || om > m || (om == m && oa < arg))) { m = om; arg = oa; }
        }

        /* 2. Σ exp(z − max): subtracting the max keeps exp from overflowing */
        float s = 0.f;
        for (int j = lane; j < classes; j += 32) s += expf(z[j] - m);
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(full, s, off);
        const float lse = m + logf(s);

        /* 3. loss of this row: logsumexp − z[label]. An out-of-range label gives NaN (a visible
         *    poisoned loss) rather than an out-of-bounds read. Read before step 4 writes, so
         *    dlogits may alias logits. */
        const int label = labels[row];
        const int valid = label >= 0 && label < classes;
        if (lane == 0) {
            my_loss += valid ? (double)(lse - z[label]) : (double)NAN;
            my_correct += valid && arg == label;
        }
        __syncwarp();

        /* 4. dlogits = scale · (softmax − onehot) */
        for (int j = lane; j < classes; j += 32) {
            float p = expf(z[j] - m) / s;
            dz[j] = scale * (p - (j == label ? 1.f : 0.f));
        }
    }

    if (lane == 0) {
        warp_loss[warp] = my_loss;
        warp_correct[warp] = my_correct;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        int total_correct = 0;
        for (int w = 0; w < XENT_WARPS; w++) {
            total += warp_loss[w];
            total_correct += warp_correct[w];
        }
        *loss = (float)((double)scale * total);
        *correct = total_correct;
    }
}

/* ---- SGD ------------------------------------------------------------------------------------- */

/* PyTorch's torch.optim.SGD (dampening 0, no nesterov) for one element. */
__device__ __forceinline__ void sgd_update(float &p, float g, float &buf, float lr, float momentum,
                                           float wd, int first) {
    g = g + wd * p;
    if (momentum != 0.f) {
        buf = first ? g : momentum * buf + g;
        g = buf;
    }
    p = p - lr * g;
}

/* skip (may be NULL): a device flag; when it is non-zero the step is skipped and nothing is written
 * (the GradScaler's found_inf, read on the device so the host never waits for it). */
__global__ void sgd_kernel(int64_t count, float *params, const float *grads, float *buf, float lr,
                           float momentum, float wd, int first, const float *skip) {
    if (skip && *skip != 0.f) return;
    GRID_STRIDE(i, count) {
        float p = params[i], b = 0.f;
        if (momentum != 0.f && !first) b = buf[i];
        sgd_update(p, grads[i], b, lr, momentum, wd, first);
        params[i] = p;
        if (momentum != 0.f) buf[i] = b;
    }
}

/* The same with 16-byte loads/stores: 4 floats per thread, a quarter of the memory transactions.
 * The optimizer step is purely bandwidth-bound, so this is the one kernel where it matters. */
__global__ void sgd_kernel_vec4(int64_t count4, float4 *params, const float4 *grads, float4 *buf,
                                float lr, float momentum, float wd, int first, const float *skip) {
    if (skip && *skip != 0.f) return;
    GRID_STRIDE(i, count4) {
        float4 p = params[i], g = grads[i], b = make_float4(0.f, 0.f, 0.f, 0.f);
        if (momentum != 0.f && !first) b = buf[i];
        sgd_update(p.x, g.x, b.x, lr, momentum, wd, first);
        sgd_update(p.y, g.y, b.y, lr, momentum, wd, first);
        sgd_update(p.z, g.z, b.z, lr, momentum, wd, first);
        sgd_update(p.w, g.w, b.w, lr, momentum, wd, first);
        params[i] = p;
        if (momentum != 0.f) buf[i] = b;
    }
}

/* ================================================================================================
 * Mixed precision: T = __half (fp16) or __nv_bfloat16 (bf16). Loads widen to float exactly, stores
 * round to nearest even (cvt.rn), every sum is a float.
 * ============================================================================================== */

__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

template <typename T> __global__ void cast_to_kernel(int64_t count, const float *src, T *dst) {
    GRID_STRIDE(i, count) dst[i] = from_f<T>(src[i]);
}

template <typename T>
__global__ void cast_from_kernel(int64_t count, const T *src, float *dst, int accumulate) {
    GRID_STRIDE(i, count) dst[i] = accumulate ? dst[i] + to_f(src[i]) : to_f(src[i]);
}

template <typename T> __global__ void relu_forward_lp_kernel(int64_t count, const T *x, T *y) {
    GRID_STRIDE(i, count) {
        float v = to_f(x[i]);
        y[i] = v < 0.f ? from_f<T>(0.f) : x[i];
    }
}

template <typename T>
__global__ void relu_backward_lp_kernel(int64_t count, const T *y, const T *dy, T *dx,
                                        int accumulate) {
    GRID_STRIDE(i, count) {
        float g = to_f(y[i]) > 0.f ? to_f(dy[i]) : 0.f;
        dx[i] = from_f<T>(accumulate ? to_f(dx[i]) + g : g);
    }
}

template <typename T> __global__ void add_forward_lp_kernel(int64_t count, const T *a, const T *b, T *y) {
    GRID_STRIDE(i, count) y[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

template <typename T>
__global__ void grad_pass_lp_kernel(int64_t count, const T *src, T *dst, int accumulate) {
    GRID_STRIDE(i, count) dst[i] = accumulate ? from_f<T>(to_f(dst[i]) + to_f(src[i])) : src[i];
}

/* Row r = (image, channel) of the [n][c] output. NCHW: its hw values are contiguous; NHWC: they
 * are c apart, and neighbouring threads (channels) read neighbouring addresses. */
template <typename T>
__global__ void avgpool_forward_lp_kernel(int64_t rows, int c, int hw, int nhwc, const T *x, T *y) {
    GRID_STRIDE(r, rows) {
        const T *p = nhwc ? x + (r / c) * hw * c + r % c : x + r * hw;
        const int64_t step = nhwc ? c : 1;
        float s = 0.f;
        for (int j = 0; j < hw; j++) s += to_f(p[j * step]);
        y[r] = from_f<T>(s / (float)hw);
    }
}

template <typename T>
__global__ void avgpool_backward_lp_kernel(int64_t count, int c, int hw, int nhwc, const T *dy, T *dx,
                                           int accumulate) {
    GRID_STRIDE(i, count) {
        int64_t row = nhwc ? (i / ((int64_t)hw * c)) * c + i % c : i / hw;
        float g = to_f(dy[row]) / (float)hw;
        dx[i] = from_f<T>(accumulate ? to_f(dx[i]) + g : g);
    }
}

/* ---- channels-last casts ---------------------------------------------------------------------- */

/* fp32 [n][c][hw] → T [n][hw][c]; one thread per output element (coalesced writes). */
template <typename T>
__global__ void cast_to_nhwc_kernel(int64_t count, int c, int hw, const float *src, T *dst) {
    GRID_STRIDE(o, count) {
        int ch = (int)(o % c);
        int64_t t = o / c;
        int j = (int)(t % hw);
        int64_t i = t / hw;
        dst[o] = from_f<T>(src[(i * c + ch) * hw + j]);
    }
}

/* fp32 [cout][cin][kk] → T [cout][kk][cin] (cuDNN's KRSC filter). */
template <typename T>
__global__ void cast_weight_khwc_kernel(int64_t count, int cin, int kk, const float *src, T *dst) {
    GRID_STRIDE(o, count) {
        int ci = (int)(o % cin);
        int64_t t = o / cin;
        int r = (int)(t % kk);
        int64_t co = t / kk;
        dst[o] = from_f<T>(src[(co * cin + ci) * kk + r]);
    }
}

/* T [cout][kk][cin] gradient → fp32 [cout][cin][kk], written or added. */
template <typename T>
__global__ void cast_from_khwc_kernel(int64_t count, int cin, int kk, const T *src, float *dst,
                                      int accumulate) {
    GRID_STRIDE(o, count) {
        int r = (int)(o % kk);
        int64_t t = o / kk;
        int ci = (int)(t % cin);
        int64_t co = t / cin;
        float g = to_f(src[(co * kk + r) * cin + ci]);
        dst[o] = accumulate ? dst[o] + g : g;
    }
}

/* y[row][o] = b[o]: the C operand of the GEMM that adds x·Wᵀ to it with one rounding. */
template <typename T> __global__ void bias_fill_lp_kernel(int64_t count, int out, const T *b, T *y) {
    GRID_STRIDE(i, count) y[i] = b[i % out];
}

/* db[o] = Σ_rows dy[row][o] in float, rounded once (a fresh T gradient, overwritten). */
template <typename T> __global__ void bias_grad_lp_kernel(int n, int out, const T *dy, T *db) {
    GRID_STRIDE(o, out) {
        float s = 0.f;
        for (int r = 0; r < n; r++) s += to_f(dy[(int64_t)r * out + o]);
        db[o] = from_f<T>(s);
    }
}

/* ---- batch norm on T activations, fp32 statistics and parameters ----------------------------- */
/* One block per channel walks that channel's n·hw values (image i's run starts at (i·c + ch)·hw).
 * Sums are float, combined in a fixed tree: deterministic. Two passes for the variance, as the
 * reference. */
#define BN_THREADS 512

__device__ float block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? sh[lane] : 0.f;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    float total = sh[0];
    __syncthreads(); /* sh is reused by the next call */
    return total;
}

/* The k-th value of channel ch: image k / hw, position k % hw. 32-bit division (the launcher checks
 * n·hw < 2^31): a 64-bit one costs several times more, once per element. */
__device__ __forceinline__ int64_t bn_at(uint32_t k, uint32_t c, uint32_t hw, uint32_t ch,
                                         int nhwc) {
    if (nhwc) return (int64_t)k * c + ch; /* k = image·hw + position; the channel is innermost */
    uint32_t i = k / hw;
    return ((int64_t)i * c + ch) * hw + (k - i * hw);
}
#define FOR_CHANNEL_VALUES(at) /* this thread's share of the block's channel */                  \
    _Pragma("unroll 4") for (uint32_t k_ = threadIdx.x, total_ = (uint32_t)n * hw; k_ < total_;      \
                             k_ += blockDim.x) if (const int64_t at = bn_at(k_, c, hw, ch, nhwc); true)

template <typename T>
__global__ void __launch_bounds__(BN_THREADS)
    bn_forward_train_lp_kernel(int nhwc, int n, int c, int hw, const T *x, const float *gamma,
                               const float *beta, float *running_mean, float *running_var,
                               float momentum, float eps, float *save_mean, float *save_invstd,
                               T *y) {
    __shared__ float sh[32];
    const int ch = blockIdx.x;
    const float count = (float)n * hw;
    float s = 0.f;
    FOR_CHANNEL_VALUES(at) s += to_f(x[at]);
    const float mean = block_sum(s, sh) / count;
    float ss = 0.f;
    FOR_CHANNEL_VALUES(at) {
        float dv = to_f(x[at]) - mean;
        ss += dv * dv;
    }
    const float var = block_sum(ss, sh) / count; /* biased: what normalises */
    const float invstd = 1.f / sqrtf(var + eps);
    if (threadIdx.x == 0) {
        save_mean[ch] = mean;
        save_invstd[ch] = invstd;
        running_mean[ch] = (1.f - momentum) * running_mean[ch] + momentum * mean;
        running_var[ch] = (1.f - momentum) * running_var[ch] + momentum * var * count / (count - 1.f);
    }
    const float scale = invstd * gamma[ch], shift = beta[ch];
    FOR_CHANNEL_VALUES(at) y[at] = from_f<T>((to_f(x[at]) - mean) * scale + shift);
}

template <typename T>
__global__ void bn_forward_eval_lp_kernel(int64_t count, int nhwc, int c, int hw, const T *x,
                                          const float *gamma, const float *beta,
                                          const float *running_mean, const float *running_var,
                                          float eps, T *y) {
    GRID_STRIDE(i, count) {
        int ch = (int)(nhwc ? i % c : (i / hw) % c);
        float scale = gamma[ch] / sqrtf(running_var[ch] + eps);
        y[i] = from_f<T>((to_f(x[i]) - running_mean[ch]) * scale + beta[ch]);
    }
}

template <typename T>
__global__ void __launch_bounds__(BN_THREADS)
    bn_backward_lp_kernel(int nhwc, int n, int c, int hw, const T *x, const T *dy, const float *gamma,
                          const float *save_mean, const float *save_invstd, T *dx, float *dgamma,
                          float *dbeta, int accumulate) {
    __shared__ float sh[32];
    const int ch = blockIdx.x;
    const float count = (float)n * hw, mean = save_mean[ch], invstd = save_invstd[ch];
    float sdy = 0.f, sdyx = 0.f;
    FOR_CHANNEL_VALUES(at) {
        float g = to_f(dy[at]);
        sdy += g;
        sdyx += g * ((to_f(x[at]) - mean) * invstd);
    }
    sdy = block_sum(sdy, sh);
    sdyx = block_sum(sdyx, sh);
    if (threadIdx.x == 0) {
        dbeta[ch] += sdy;
        dgamma[ch] += sdyx;
    }
    const float kk = gamma[ch] * invstd, mdy = sdy / count, mdyx = sdyx / count;
    FOR_CHANNEL_VALUES(at) {
        float xhat = (to_f(x[at]) - mean) * invstd;
        float g = kk * (to_f(dy[at]) - mdy - xhat * mdyx);
        dx[at] = from_f<T>(accumulate ? to_f(dx[at]) + g : g);
    }
}

/* ---- GradScaler ------------------------------------------------------------------------------ */

__global__ void scale_by_device_kernel(int64_t count, float *x, const float *alpha) {
    GRID_STRIDE(i, count) x[i] *= *alpha;
}

/* As torch's _amp_non_finite_check_and_unscale_: the check is on the scaled value; every thread
 * that sees one writes the same 1.0 (a benign race, no atomics needed). */
__global__ void amp_unscale_check_kernel(int64_t count, float *g, const float *inv_scale,
                                         float *found_inf) {
    const float inv = *inv_scale;
    GRID_STRIDE(i, count) {
        float v = g[i];
        if (!isfinite(v)) *found_inf = 1.f;
        g[i] = inv == 1.f ? v : v * inv;
    }
}

/* One thread: torch's _amp_update_scale_ (float scale times a double factor, rounded to float). */
__global__ void amp_update_scale_kernel(float *scale, float *inv_scale, int32_t *tracker,
                                        float *found_inf, int64_t *skipped, double growth,
                                        double backoff, int interval) {
    if (*found_inf != 0.f) {
        *scale = (float)((double)*scale * backoff);
        *tracker = 0;
        *skipped += 1;
    } else {
        int32_t successful = *tracker + 1;
        if (successful == interval) {
            float grown = (float)((double)*scale * growth);
            if (isfinite(grown)) *scale = grown;
            *tracker = 0;
        } else {
            *tracker = successful;
        }
    }
    *inv_scale = (float)(1.0 / (double)*scale);
    *found_inf = 0.f;
}

/* Integer counts: per-block sums, then one 64-bit integer atomic per block (exact, any order). */
__global__ void count_zero_nonfinite_kernel(int64_t count, const float *x,
                                            unsigned long long *counts) {
    __shared__ float sh[32];
    float zero = 0.f, bad = 0.f; /* per thread ≤ count / threads: exact in float below 2^24 */
    GRID_STRIDE(i, count) {
        float v = x[i];
        zero += v == 0.f;
        bad += !isfinite(v);
    }
    zero = block_sum(zero, sh);
    bad = block_sum(bad, sh);
    if (threadIdx.x == 0) {
        atomicAdd(&counts[0], (unsigned long long)zero);
        atomicAdd(&counts[1], (unsigned long long)bad);
    }
}

/* ---- launchers ------------------------------------------------------------------------------- */

extern "C" {

void launch_relu_forward(cudaStream_t s, int64_t count, const float *x, float *y) {
    if (count <= 0) return;
    relu_forward_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, x, y);
}

void launch_relu_backward(cudaStream_t s, int64_t count, const float *y, const float *dy, float *dx,
                          int accumulate) {
    if (count <= 0) return;
    relu_backward_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, y, dy, dx, accumulate);
}

void launch_add_forward(cudaStream_t s, int64_t count, const float *a, const float *b, float *y) {
    if (count <= 0) return;
    add_forward_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, a, b, y);
}

void launch_grad_pass(cudaStream_t s, int64_t count, const float *src, float *dst, int accumulate) {
    if (count <= 0 || (!accumulate && src == dst)) return;
    grad_pass_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, src, dst, accumulate);
}

void launch_scale_inplace(cudaStream_t s, int64_t count, float *x, float alpha) {
    if (count <= 0) return;
    scale_inplace_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, x, alpha);
}

void launch_add_inplace(cudaStream_t s, int64_t count, const float *x, float *y) {
    if (count <= 0) return;
    add_inplace_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, x, y);
}

void launch_avgpool_forward(cudaStream_t s, int n, int c, int hw, const float *x, float *y) {
    int64_t rows = (int64_t)n * c;
    if (rows <= 0 || hw <= 0) return;
    avgpool_forward_kernel<<<blocks_for(rows), THREADS, 0, s>>>(rows, hw, x, y);
}

void launch_avgpool_backward(cudaStream_t s, int n, int c, int hw, const float *dy, float *dx,
                             int accumulate) {
    int64_t count = (int64_t)n * c * hw;
    if (count <= 0) return;
    avgpool_backward_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, hw, dy, dx, accumulate);
}

void launch_bias_add(cudaStream_t s, int n, int out, const float *b, float *y) {
    int64_t count = (int64_t)n * out;
    if (count <= 0) return;
    bias_add_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, out, b, y);
}

void launch_bias_grad(cudaStream_t s, int n, int out, const float *dy, float *db) {
    if (n <= 0 || out <= 0) return;
    bias_grad_kernel<<<blocks_for(out), THREADS, 0, s>>>(n, out, dy, db);
}

void launch_xent_forward_backward(cudaStream_t s, int n, int classes, const float *logits,
                                  const int32_t *labels, float scale, float *loss, int32_t *correct,
                                  float *dlogits) {
    /* n == 0 still launches: *loss and *correct must be written (as 0). */
    xent_kernel<<<1, XENT_THREADS, 0, s>>>(n, classes, logits, labels, scale, loss, correct,
                                           dlogits);
}

void launch_sgd_step(cudaStream_t s, int64_t count, float *params, const float *grads,
                     float *momentum_buf, float lr, float momentum, float weight_decay, int first) {
    launch_sgd_step_unless(s, count, params, grads, momentum_buf, lr, momentum, weight_decay, first,
                           NULL);
}

void launch_sgd_step_unless(cudaStream_t s, int64_t count, float *params, const float *grads,
                            float *momentum_buf, float lr, float momentum, float weight_decay,
                            int first, const float *skip) {
    if (count <= 0) return;
    /* float4 access needs 16-byte aligned pointers and a whole number of float4s. device_alloc'd
     * buffers are aligned; a slice into the middle of one may not be, hence the check. */
    int aligned = ((uintptr_t)params % 16 == 0) && ((uintptr_t)grads % 16 == 0) &&
                  (momentum == 0.f || (uintptr_t)momentum_buf % 16 == 0);
    if (aligned && count % 4 == 0) {
        int64_t count4 = count / 4;
        sgd_kernel_vec4<<<blocks_for(count4), THREADS, 0, s>>>(
            count4, (float4 *)params, (const float4 *)grads, (float4 *)momentum_buf, lr, momentum,
            weight_decay, first, skip);
    } else {
        sgd_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, params, grads, momentum_buf, lr,
                                                         momentum, weight_decay, first, skip);
    }
}

/* ---- mixed precision: p = 1 → __half, 2 → __nv_bfloat16 ------------------------------------- */

#define LP(p, T_CALL_HALF, T_CALL_BF16) ((p) == 1 ? (void)(T_CALL_HALF) : (void)(T_CALL_BF16))
#define H(ptr) ((__half *)(ptr))
#define B(ptr) ((__nv_bfloat16 *)(ptr))
#define CH(ptr) ((const __half *)(ptr))
#define CB(ptr) ((const __nv_bfloat16 *)(ptr))

void launch_cast_to(cudaStream_t s, int p, int64_t count, const float *src, void *dst) {
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (cast_to_kernel<<<g, THREADS, 0, s>>>(count, src, H(dst)), 0),
       (cast_to_kernel<<<g, THREADS, 0, s>>>(count, src, B(dst)), 0));
}

void launch_cast_from(cudaStream_t s, int p, int64_t count, const void *src, float *dst,
                      int accumulate) {
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (cast_from_kernel<<<g, THREADS, 0, s>>>(count, CH(src), dst, accumulate), 0),
       (cast_from_kernel<<<g, THREADS, 0, s>>>(count, CB(src), dst, accumulate), 0));
}

void launch_relu_forward_lp(cudaStream_t s, int p, int64_t count, const void *x, void *y) {
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (relu_forward_lp_kernel<<<g, THREADS, 0, s>>>(count, CH(x), H(y)), 0),
       (relu_forward_lp_kernel<<<g, THREADS, 0, s>>>(count, CB(x), B(y)), 0));
}

void launch_relu_backward_lp(cudaStream_t s, int p, int64_t count, const void *y, const void *dy,
                             void *dx, int accumulate) {
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (relu_backward_lp_kernel<<<g, THREADS, 0, s>>>(count, CH(y), CH(dy), H(dx), accumulate), 0),
       (relu_backward_lp_kernel<<<g, THREADS, 0, s>>>(count, CB(y), CB(dy), B(dx), accumulate), 0));
}

void launch_add_forward_lp(cudaStream_t s, int p, int64_t count, const void *a, const void *b,
                           void *y) {
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (add_forward_lp_kernel<<<g, THREADS, 0, s>>>(count, CH(a), CH(b), H(y)), 0),
       (add_forward_lp_kernel<<<g, THREADS, 0, s>>>(count, CB(a), CB(b), B(y)), 0));
}

void launch_grad_pass_lp(cudaStream_t s, int p, int64_t count, const void *src, void *dst,
                         int accumulate) {
    if (count <= 0 || (!accumulate && src == dst)) return;
    int g = blocks_for(count);
    LP(p, (grad_pass_lp_kernel<<<g, THREADS, 0, s>>>(count, CH(src), H(dst), accumulate), 0),
       (grad_pass_lp_kernel<<<g, THREADS, 0, s>>>(count, CB(src), B(dst), accumulate), 0));
}

void launch_avgpool_forward_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                               void *y) {
    int64_t rows = (int64_t)n * c;
    if (rows <= 0 || hw <= 0) return;
    int g = blocks_for(rows);
    LP(p, (avgpool_forward_lp_kernel<<<g, THREADS, 0, s>>>(rows, c, hw, nhwc, CH(x), H(y)), 0),
       (avgpool_forward_lp_kernel<<<g, THREADS, 0, s>>>(rows, c, hw, nhwc, CB(x), B(y)), 0));
}

void launch_avgpool_backward_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw,
                                const void *dy, void *dx, int accumulate) {
    int64_t count = (int64_t)n * c * hw;
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (avgpool_backward_lp_kernel<<<g, THREADS, 0, s>>>(count, c, hw, nhwc, CH(dy), H(dx), accumulate), 0),
       (avgpool_backward_lp_kernel<<<g, THREADS, 0, s>>>(count, c, hw, nhwc, CB(dy), B(dx), accumulate), 0));
}

void launch_cast_to_nhwc(cudaStream_t s, int p, int n, int c, int hw, const float *src, void *dst) {
    int64_t count = (int64_t)n * c * hw;
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (cast_to_nhwc_kernel<<<g, THREADS, 0, s>>>(count, c, hw, src, H(dst)), 0),
       (cast_to_nhwc_kernel<<<g, THREADS, 0, s>>>(count, c, hw, src, B(dst)), 0));
}

void launch_cast_weight_khwc(cudaStream_t s, int p, int cout, int cin, int kk, const float *src,
                             void *dst) {
    int64_t count = (int64_t)cout * cin * kk;
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (cast_weight_khwc_kernel<<<g, THREADS, 0, s>>>(count, cin, kk, src, H(dst)), 0),
       (cast_weight_khwc_kernel<<<g, THREADS, 0, s>>>(count, cin, kk, src, B(dst)), 0));
}

void launch_cast_from_khwc(cudaStream_t s, int p, int cout, int cin, int kk, const void *src,
                           float *dst, int accumulate) {
    int64_t count = (int64_t)cout * cin * kk;
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (cast_from_khwc_kernel<<<g, THREADS, 0, s>>>(count, cin, kk, CH(src), dst, accumulate), 0),
       (cast_from_khwc_kernel<<<g, THREADS, 0, s>>>(count, cin, kk, CB(src), dst, accumulate), 0));
}

void launch_bias_fill_lp(cudaStream_t s, int p, int n, int out, const void *b, void *y) {
    int64_t count = (int64_t)n * out;
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (bias_fill_lp_kernel<<<g, THREADS, 0, s>>>(count, out, CH(b), H(y)), 0),
       (bias_fill_lp_kernel<<<g, THREADS, 0, s>>>(count, out, CB(b), B(y)), 0));
}

void launch_bias_grad_lp(cudaStream_t s, int p, int n, int out, const void *dy, void *db) {
    if (out <= 0) return;
    int g = blocks_for(out);
    LP(p, (bias_grad_lp_kernel<<<g, THREADS, 0, s>>>(n, out, CH(dy), H(db)), 0),
       (bias_grad_lp_kernel<<<g, THREADS, 0, s>>>(n, out, CB(dy), B(db)), 0));
}

void launch_bn_forward_train_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                                const float *gamma, const float *beta, float *running_mean,
                                float *running_var, float momentum, float eps, float *save_mean,
                                float *save_invstd, void *y) {
    if (c <= 0 || (int64_t)n * hw >= INT32_MAX) return; /* ops_cuda.c asserts the size */
    LP(p, (bn_forward_train_lp_kernel<<<c, BN_THREADS, 0, s>>>(nhwc, n, c, hw, CH(x), gamma, beta,
                                                               running_mean, running_var, momentum,
                                                               eps, save_mean, save_invstd, H(y)), 0),
       (bn_forward_train_lp_kernel<<<c, BN_THREADS, 0, s>>>(nhwc, n, c, hw, CB(x), gamma, beta,
                                                            running_mean, running_var, momentum,
                                                            eps, save_mean, save_invstd, B(y)), 0));
}

void launch_bn_forward_eval_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                               const float *gamma, const float *beta, const float *running_mean,
                               const float *running_var, float eps, void *y) {
    int64_t count = (int64_t)n * c * hw;
    if (count <= 0) return;
    int g = blocks_for(count);
    LP(p, (bn_forward_eval_lp_kernel<<<g, THREADS, 0, s>>>(count, nhwc, c, hw, CH(x), gamma, beta,
                                                           running_mean, running_var, eps, H(y)), 0),
       (bn_forward_eval_lp_kernel<<<g, THREADS, 0, s>>>(count, nhwc, c, hw, CB(x), gamma, beta,
                                                        running_mean, running_var, eps, B(y)), 0));
}

void launch_bn_backward_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                           const void *dy, const float *gamma, const float *save_mean,
                           const float *save_invstd, void *dx, float *dgamma, float *dbeta,
                           int accumulate) {
    if (c <= 0 || (int64_t)n * hw >= INT32_MAX) return;
    LP(p, (bn_backward_lp_kernel<<<c, BN_THREADS, 0, s>>>(nhwc, n, c, hw, CH(x), CH(dy), gamma, save_mean,
                                                          save_invstd, H(dx), dgamma, dbeta,
                                                          accumulate), 0),
       (bn_backward_lp_kernel<<<c, BN_THREADS, 0, s>>>(nhwc, n, c, hw, CB(x), CB(dy), gamma, save_mean,
                                                       save_invstd, B(dx), dgamma, dbeta,
                                                       accumulate), 0));
}

/* ---- GradScaler ------------------------------------------------------------------------------ */

void launch_scale_by_device(cudaStream_t s, int64_t count, float *x, const float *alpha) {
    if (count <= 0) return;
    scale_by_device_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, x, alpha);
}

void launch_amp_unscale_check(cudaStream_t s, int64_t count, float *grads, const float *inv_scale,
                              float *found_inf) {
    if (count <= 0) return;
    amp_unscale_check_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, grads, inv_scale, found_inf);
}

void launch_amp_update_scale(cudaStream_t s, float *scale, float *inv_scale, int32_t *tracker,
                             float *found_inf, int64_t *skipped, double growth, double backoff,
                             int interval) {
    amp_update_scale_kernel<<<1, 1, 0, s>>>(scale, inv_scale, tracker, found_inf, skipped, growth,
                                            backoff, interval);
}

void launch_count_zero_nonfinite(cudaStream_t s, int64_t count, const float *x, int64_t *counts) {
    if (count <= 0) return;
    count_zero_nonfinite_kernel<<<blocks_for(count), THREADS, 0, s>>>(
        count, x, (unsigned long long *)counts);
}

} /* extern "C" */
