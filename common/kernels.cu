/* kernels.cu — the CUDA kernels that cuDNN/cuBLAS do not give us (see kernels.h).
 *
 * The mixed-precision kernels (second half) are templates over the element type T (__half or
 * __nv_bfloat16; float too, for batch norm in fp32 and for fp32 channels-last models): they load T,
 * compute in fp32 and store T rounded to nearest even — the same points at which the CPU backend's
 * emulation rounds (ops_ref.c).
 *
 * Style: one thread per element in a grid-stride loop (so any count works with a bounded grid),
 * 256 threads per block, int64 indices (a flat parameter buffer may exceed 2^31 floats in
 * principle) — except batch norm's, 32-bit for speed (ops_cuda.c checks every tensor fits).
 * Nothing here uses atomics on floats, so every result is bit-reproducible run to run: reductions
 * have one fixed summation order. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <initializer_list>

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

/* ---- 16-byte vectors -------------------------------------------------------------------------
 * A thread that moves 16 bytes with one instruction issues a quarter (fp32) to an eighth (16-bit) of
 * the memory instructions of one that moves an element at a time, with more bytes in flight: the
 * elementwise kernels below and batch norm's channels-last path use them where the tensors are
 * 16-byte aligned (the model's planned arena is). Batch norm's also needs the vector's channels to
 * divide c; an elementwise kernel leaves the count % V rest to VEC_TAIL. */
/* 16 bytes of T ↔ V floats: one load or store instruction; the 16-bit conversions two at a time
 * (round to nearest even on the way back, as from_f). */
template <typename T> struct VecOf { static constexpr int N = 16 / (int)sizeof(T); };
__device__ __forceinline__ void vload(const float *p, float (&f)[4]) {
    const float4 v = *(const float4 *)p;
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
}
__device__ __forceinline__ void vload(const __half *p, float (&f)[8]) {
    __align__(16) __half2 h[4];
    *(uint4 *)h = *(const uint4 *)p;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __half22float2(h[i]);
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ void vload(const __nv_bfloat16 *p, float (&f)[8]) {
    const uint4 r = *(const uint4 *)p;
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}
__device__ __forceinline__ void vstore(float *p, const float (&f)[4]) { *(float4 *)p = make_float4(f[0], f[1], f[2], f[3]); }
__device__ __forceinline__ void vstore(__half *p, const float (&f)[8]) {
    __align__(16) __half2 h[4];
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
    *(uint4 *)p = *(const uint4 *)h;
}
__device__ __forceinline__ void vstore(__nv_bfloat16 *p, const float (&f)[8]) {
    __align__(16) __nv_bfloat162 h[4];
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    *(uint4 *)p = *(const uint4 *)h;
}
/* V floats ↔ V/4 float4s (16-byte aligned): fp32 sides of the casts, batch norm's per-channel operands */
template <int V> __device__ __forceinline__ void vloadf(const float *p, float (&f)[V]) {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
        const float4 t = *(const float4 *)(p + j);
        f[j] = t.x, f[j + 1] = t.y, f[j + 2] = t.z, f[j + 3] = t.w;
    }
}
template <int V> __device__ __forceinline__ void vstoref(float *p, const float (&f)[V]) {
#pragma unroll
    for (int j = 0; j < V; j += 4) *(float4 *)(p + j) = make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
}
/* Elements per 16-byte vector for type p (VecOf<T>::N on the host), and whether every tensor (NULL:
 * not read) is 16-byte aligned. */
static int vec_width(int p) { return p == 0 ? 4 : 8; }
static bool aligned16(std::initializer_list<const void *> tensors) {
    for (const void *t : tensors)
        if ((uintptr_t)t % 16) return false;
    return true;
}
/* The grid of a vector kernel over count elements of type p: one thread a vector, at least a block
 * (block 0 also does the rest). */
static int vec_blocks(int64_t count, int p) { return blocks_for(count / vec_width(p) + 1); }
/* The count % V elements a vector kernel's 16-byte loop leaves: block 0 takes them one by one. */
#define VEC_TAIL(k, count, V)                                                                      \
    if (blockIdx.x == 0)                                                                           \
        for (int64_t k = (count) / (V) * (V) + threadIdx.x; k < (count); k += blockDim.x)

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

        /* 1. row maximum and its first index (argmax picks the first maximum, a NaN above all, as
         *    torch.argmax): one total order, so every lane ends with the same pair */
        float m = -INFINITY;
        int arg = -1;
        for (int j = lane; j < classes; j += 32) {
            float v = z[j];
            if (arg < 0 || v > m || (isnan(v) && !isnan(m))) { m = v; arg = j; }
        }
        for (int off = 16; off > 0; off >>= 1) {
            float om = __shfl_xor_sync(full, m, off);
            int oa = __shfl_xor_sync(full, arg, off);
            const bool onan = isnan(om), mnan = isnan(m);
            if (oa >= 0 && (arg < 0 || om > m || (onan && !mnan) || ((om == m || (onan && mnan)) && oa < arg))) {
                m = om;
                arg = oa;
            }
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
 * Mixed precision: T = __half (fp16) or __nv_bfloat16 (bf16), or float (by_type's p = 0: batch norm
 * in fp32, fp32 channels-last models). Loads widen to float exactly, stores round to nearest even
 * (cvt.rn), every sum is a float.
 * ============================================================================================== */

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

template <typename T> __global__ void cast_to_kernel(int64_t count, const float *src, T *dst) {
    GRID_STRIDE(i, count) dst[i] = from_f<T>(src[i]);
}

template <typename T> __global__ void cast_from_kernel(int64_t count, const T *src, float *dst) {
    GRID_STRIDE(i, count) dst[i] = to_f(src[i]);
}

/* x = round(x · alpha), the product in fp32 (precision_scale_stored's rule). */
template <typename T> __global__ void scale_lp_kernel(int64_t count, T *x, float alpha) {
    GRID_STRIDE(i, count) x[i] = from_f<T>(to_f(x[i]) * alpha);
}

/* The same, 16 bytes of T a thread (launch_cast_*: when the tensors are 16-byte aligned): the whole
 * weight buffer's cast once a forward, and DDP's 16-bit gradients back to fp32. */
template <typename T> __global__ void cast_to_vec_kernel(int64_t count, const float *src, T *dst) {
    constexpr int V = VecOf<T>::N;
    GRID_STRIDE(i, count / V) {
        float f[V];
        vloadf<V>(src + i * V, f);
        vstore(dst + i * V, f);
    }
    VEC_TAIL(k, count, V) dst[k] = from_f<T>(src[k]);
}

template <typename T> __global__ void cast_from_vec_kernel(int64_t count, const T *src, float *dst) {
    constexpr int V = VecOf<T>::N;
    GRID_STRIDE(i, count / V) {
        float f[V];
        vload(src + i * V, f);
        vstoref<V>(dst + i * V, f);
    }
    VEC_TAIL(k, count, V) dst[k] = to_f(src[k]);
}

/* dst += src, src = 0 (ops.h: cast_add_clear), 16 bytes of T a thread, and one element a thread
 * where the tensors are not 16-byte aligned. A zero adds nothing, not even its sign: the places no
 * layer wrote keep their bits, so where a batch ends never shows in .grad. */
template <typename T> __global__ void cast_add_clear_vec_kernel(int64_t count, T *src, float *dst) {
    constexpr int V = VecOf<T>::N;
    GRID_STRIDE(i, count / V) {
        float f[V], o[V], z[V] = {};
        vload(src + i * V, f);
        vloadf<V>(dst + i * V, o);
#pragma unroll
        for (int j = 0; j < V; j++) o[j] = f[j] != 0.f ? o[j] + f[j] : o[j];
        vstoref<V>(dst + i * V, o);
        vstore(src + i * V, z);
    }
    VEC_TAIL(k, count, V) {
        const float v = to_f(src[k]);
        if (v != 0.f) dst[k] += v;
        src[k] = from_f<T>(0.f);
    }
}

template <typename T> __global__ void cast_add_clear_kernel(int64_t count, T *src, float *dst) {
    GRID_STRIDE(i, count) {
        const float v = to_f(src[i]);
        if (v != 0.f) dst[i] += v;
        src[i] = from_f<T>(0.f);
    }
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

/* A residual block's end, y = max(0, a + b), in one pass; and its backward: the gradient masked by
 * y > 0 goes to both inputs (written or added), where ReLU's backward and the add's two copies
 * were three passes. da may be dy itself (the memory plan's alias): each element is read first. */
template <typename T> __global__ void add_relu_forward_kernel(int64_t count, const T *a, const T *b, T *y) {
    GRID_STRIDE(i, count) {
        float v = to_f(from_f<T>(to_f(a[i]) + to_f(b[i]))); /* the add's rounding, then ReLU's */
        y[i] = from_f<T>(v < 0.f ? 0.f : v);
    }
}

template <typename T>
__global__ void add_relu_backward_kernel(int64_t count, const T *y, const T *dy, T *da, int acc_a,
                                         T *db, int acc_b) {
    GRID_STRIDE(i, count) {
        const float g = to_f(y[i]) > 0.f ? to_f(dy[i]) : 0.f;
        const float a = acc_a ? to_f(da[i]) + g : g, b = acc_b ? to_f(db[i]) + g : g;
        da[i] = from_f<T>(a);
        db[i] = from_f<T>(b);
    }
}

/* The same two, 16 bytes a thread (launch_add_relu_*: when the tensors are 16-byte aligned).
 * ReLU then rounding gives the scalar kernel's bits, rounding then ReLU: a sum of two T
 * values that is not zero never rounds to zero, so rounding keeps its sign (and NaN stays NaN). */
template <typename T> __global__ void add_relu_forward_vec_kernel(int64_t count, const T *a, const T *b, T *y) {
    constexpr int V = VecOf<T>::N;
    GRID_STRIDE(i, count / V) {
        float x[V], z[V];
        vload(a + i * V, x), vload(b + i * V, z);
#pragma unroll
        for (int j = 0; j < V; j++) {
            const float v = x[j] + z[j];
            x[j] = v < 0.f ? 0.f : v;
        }
        vstore(y + i * V, x);
    }
    VEC_TAIL(k, count, V) {
        const float v = to_f(a[k]) + to_f(b[k]);
        y[k] = from_f<T>(v < 0.f ? 0.f : v);
    }
}

template <typename T>
__global__ void add_relu_backward_vec_kernel(int64_t count, const T *y, const T *dy, T *da, int acc_a, T *db,
                                             int acc_b) {
    constexpr int V = VecOf<T>::N;
    GRID_STRIDE(i, count / V) {
        float fy[V], g[V], a[V], b[V];
        vload(y + i * V, fy), vload(dy + i * V, g);
        if (acc_a) vload(da + i * V, a);
        if (acc_b) vload(db + i * V, b);
#pragma unroll
        for (int j = 0; j < V; j++) {
            g[j] = fy[j] > 0.f ? g[j] : 0.f;
            a[j] = acc_a ? a[j] + g[j] : g[j], b[j] = acc_b ? b[j] + g[j] : g[j];
        }
        vstore(da + i * V, a), vstore(db + i * V, b);
    }
    VEC_TAIL(k, count, V) {
        const float g = to_f(y[k]) > 0.f ? to_f(dy[k]) : 0.f;
        da[k] = from_f<T>(acc_a ? to_f(da[k]) + g : g), db[k] = from_f<T>(acc_b ? to_f(db[k]) + g : g);
    }
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
/* Training batch norm is a reduction per channel over n·hw values followed by an elementwise pass.
 * One block per channel (the obvious kernel, and cuDNN's NCHW "1C11" kernels) leaves most of an
 * H200 idle at 64 channels, and in NHWC it reads with a stride of c. So each pass is three kernels:
 *   1. partials: the n·hw rows of every channel are cut into G fixed chunks; one block reduces one
 *      chunk of 32 channels (NHWC: a warp reads 32 neighbouring channels of a row; the vector path
 *      below, 32 or 64 channels in 16-byte pieces) or of one channel (NCHW: threads walk the
 *      contiguous hw run of each image);
 *   2. finalize: 32–256 threads per channel combine its G partials in a fixed order;
 *   3. apply: elementwise, one thread per value (the vector path: per 16 bytes).
 * Every order is fixed, so results are bit-reproducible run to run. The forward's partials are
 * (mean, M2) of each chunk, merged with Chan's formula — one pass over x, no E[x²]−E[x]² cancellation.
 * relu = 1 fuses the ReLU that follows (forward: y = max(0, bn(x)); backward: the gradient is
 * masked by y > 0 first, y being the fused output) — one pass over the activation saved each way. */
#define BN_ROWS_NHWC 8   /* NHWC block: 32 channels × 8 rows */
#define BN_THREADS 256
#define BN_TARGET_BLOCKS 512
#ifndef BN_VEC_TARGET_BLOCKS
/* the vector path's (below): 512 doubled the finalize's work and slowed stage 5 (2.83 against 2.74 ms fp16) */
#define BN_VEC_TARGET_BLOCKS 256
#endif

/* The chunk plan, the same in every kernel of a pass. */
struct BnPlan {
    uint32_t rows, chunks; /* rows = n·hw values per channel; G = chunks */
    __host__ __device__ uint32_t lo(uint32_t g) const { return (uint32_t)((uint64_t)rows * g / chunks); }
};

static BnPlan bn_plan(int nhwc, int n, int c, int hw) {
    BnPlan p;
    p.rows = (uint32_t)n * (uint32_t)hw;
    int64_t cblocks = nhwc ? (c + 31) / 32 : c;
    int64_t g = BN_TARGET_BLOCKS / cblocks, most = p.rows / (nhwc ? 64 : 256);
    if (g > most) g = most;
    p.chunks = (uint32_t)(g < 1 ? 1 : g);
    return p;
}

/* The vector path's plan (below): its own target (its blocks span TX·V channels), and a chunk holds
 * at least BN_UNROLL rows per thread (layer 4's 2,048 rows otherwise gave each thread 2 rows, and
 * the block's tree cost more than its loads). It never cuts more chunks than bn_plan. */
#define BN_UNROLL 4
static BnPlan bn_vec_plan(int n, int c, int hw, int V, int tx) {
    BnPlan p;
    p.rows = (uint32_t)n * (uint32_t)hw;
    int64_t cblocks = (c / V + tx - 1) / tx, g = BN_VEC_TARGET_BLOCKS / cblocks,
            most = p.rows / ((BN_THREADS / tx) * BN_UNROLL);
    if (g > most) g = most;
    p.chunks = (uint32_t)(g < 1 ? 1 : g);
    return p;
}

/* The index of row k (= image·hw + position) of channel ch. */
__device__ __forceinline__ uint64_t bn_idx(uint32_t k, uint32_t c, uint32_t hw, uint32_t ch, bool nhwc) {
    if (nhwc) return (uint64_t)k * c + ch;
    uint32_t i = k / hw;
    return ((uint64_t)i * c + ch) * hw + (k - i * hw);
}

/* Chan et al.: (na, ma, M2a) ⊕ (nb, mb, M2b). */
__device__ __forceinline__ void chan_merge(float &na, float &ma, float &m2a, float nb, float mb, float m2b) {
    float n = na + nb;
    if (nb == 0.f) return;
    float delta = mb - ma, f = nb / n;
    ma += delta * f;
    m2a += m2b + delta * delta * na * f;
    na = n;
}

/* This thread's slot: NHWC blocks are (32 channels) × (8 row lanes), NCHW blocks 256 row lanes of
 * one channel. Returns the channel (or −1) and sets the lane and the lane count. */
__device__ __forceinline__ int bn_thread(bool nhwc, int c, uint32_t &lane, uint32_t &lanes, int &slot) {
    if (nhwc) {
        lane = threadIdx.y, lanes = BN_ROWS_NHWC, slot = threadIdx.y * 32 + threadIdx.x;
        int ch = blockIdx.y * 32 + threadIdx.x;
        return ch < c ? ch : -1;
    }
    lane = threadIdx.x, lanes = BN_THREADS, slot = threadIdx.x;
    return blockIdx.y;
}

/* Fixed-order tree over the lanes of one channel in shared memory (slot stride: 32 in NHWC). */
#define BN_TREE(nhwc, lane, lanes, slot, MERGE)                                                   \
    for (uint32_t half_ = (lanes) / 2; half_ > 0; half_ /= 2) {                                    \
        __syncthreads();                                                                           \
        if ((lane) < half_) { const int o_ = (slot) + half_ * ((nhwc) ? 32 : 1); MERGE; }          \
    }                                                                                              \
    __syncthreads();

template <typename T, bool NHWC>
__global__ void __launch_bounds__(BN_THREADS)
    bn_partial_stats_kernel(BnPlan pl, int c, int hw, const T *x, float *part) {
    __shared__ float sn[BN_THREADS], sm[BN_THREADS], s2[BN_THREADS];
    uint32_t lane, lanes;
    int slot;
    const int ch = bn_thread(NHWC, c, lane, lanes, slot);
    const uint32_t g = blockIdx.x, lo = pl.lo(g), hi = pl.lo(g + 1);
    float cnt = 0.f, mean = 0.f, m2 = 0.f; /* Welford */
    if (ch >= 0)
        for (uint32_t k = lo + lane; k < hi; k += lanes) {
            float v = to_f(x[bn_idx(k, c, hw, ch, NHWC)]);
            cnt += 1.f;
            float d = v - mean;
            mean += d / cnt;
            m2 += d * (v - mean);
        }
    sn[slot] = cnt, sm[slot] = mean, s2[slot] = m2;
    BN_TREE(NHWC, lane, lanes, slot, chan_merge(sn[slot], sm[slot], s2[slot], sn[o_], sm[o_], s2[o_]));
    if (lane == 0 && ch >= 0) part[((size_t)g * c + ch) * 2] = sm[slot], part[((size_t)g * c + ch) * 2 + 1] = s2[slot];
}

/* Finalize: L lanes per channel (L = the chunk count rounded up to a power of two, 32–256) and
 * 256 / L channels per block: lane l merges chunks l, l + L, … in order — every chunk's partial is
 * loaded at once — then a fixed-order tree over the lanes. (One thread per channel merging 256
 * chunks serially took 40 µs a call on an H200; one warp per channel, 8–16 dependent loads a lane,
 * 6–14 µs; a whole block per channel wasted most of its threads on layers 3–4, which have 8–32
 * chunks.) */
#define BN_FIN_THREADS 256
static dim3 bn_fin_block(uint32_t chunks) {
    uint32_t lanes = 32;
    while (lanes < chunks && lanes < BN_FIN_THREADS) lanes *= 2;
    return dim3(lanes, BN_FIN_THREADS / lanes);
}
static dim3 bn_fin_grid(int c, dim3 block) { return dim3((c + block.y - 1) / block.y); }

/* SyncBatchNorm (kernels.h): channel ch's triple goes to this rank's slot of the exchange buffer, and
 * the other ranks' slots are zeroed, so that the sum over ranks is an all-gather. */
__device__ __forceinline__ void bn_exchange_put(const BnExchange &x, int c, int ch, float a, float b, float d) {
    for (int r = 0; r < x.world; r++) {
        float *t = x.buf + ((size_t)r * c + ch) * 3;
        const bool mine = r == x.rank;
        t[0] = mine ? a : 0.f, t[1] = mine ? b : 0.f, t[2] = mine ? d : 0.f;
    }
}

/* A channel's statistics (n values, their mean and M2) made into what the rest of the pass reads. */
__device__ __forceinline__ void bn_stats_out(int c, int ch, float n, float mean, float m2, float momentum, float eps,
                                             float *running_mean, float *running_var, float *save_mean,
                                             float *save_invstd, const float *gamma, const float *beta, float *vec) {
    const float var = m2 / n; /* biased: what normalises */
    save_mean[ch] = mean;
    save_invstd[ch] = 1.f / sqrtf(var + eps);
    if (vec) /* the vector apply's operands, channel-contiguous */
        vec[ch] = mean, vec[c + ch] = save_invstd[ch] * gamma[ch], vec[2 * c + ch] = beta[ch];
    running_mean[ch] = (1.f - momentum) * running_mean[ch] + momentum * mean;
    running_var[ch] = (1.f - momentum) * running_var[ch] + momentum * var * n / (n - 1.f);
}

/* Without an exchange (x.buf null) the statistics are this batch's; with one, this rank's go to the
 * exchange, and the sync kernel below finishes the pass once the ranks' are summed. */
__global__ void __launch_bounds__(BN_FIN_THREADS)
    bn_finalize_stats_kernel(BnPlan pl, int c, const float *part, float momentum, float eps, float *running_mean,
                             float *running_var, float *save_mean, float *save_invstd, const float *gamma,
                             const float *beta, float *vec, BnExchange x) {
    __shared__ float sn[BN_FIN_THREADS], sm[BN_FIN_THREADS], s2[BN_FIN_THREADS];
    const uint32_t L = blockDim.x, lane = threadIdx.x;
    const int ch = blockIdx.x * blockDim.y + threadIdx.y, t = threadIdx.y * L + lane;
    float n = 0.f, mean = 0.f, m2 = 0.f;
    if (ch < c)
        for (uint32_t g = lane; g < pl.chunks; g += L)
            chan_merge(n, mean, m2, (float)(pl.lo(g + 1) - pl.lo(g)), part[((size_t)g * c + ch) * 2],
                       part[((size_t)g * c + ch) * 2 + 1]);
    sn[t] = n, sm[t] = mean, s2[t] = m2;
    BN_TREE(false, lane, L, t, chan_merge(sn[t], sm[t], s2[t], sn[o_], sm[o_], s2[o_]));
    if (ch >= c || lane != 0) return;
    if (x.buf) bn_exchange_put(x, c, ch, sn[t], sm[t], s2[t]);
    else bn_stats_out(c, ch, sn[t], sm[t], s2[t], momentum, eps, running_mean, running_var, save_mean, save_invstd,
                      gamma, beta, vec);
}

/* SyncBatchNorm: every rank's (n, mean, M2) merged in rank order — the same bits on every rank. */
__global__ void bn_sync_stats_kernel(int c, BnExchange x, float momentum, float eps, float *running_mean,
                                     float *running_var, float *save_mean, float *save_invstd, const float *gamma,
                                     const float *beta, float *vec) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c) return;
    float n = 0.f, mean = 0.f, m2 = 0.f;
    for (int r = 0; r < x.world; r++) {
        const float *t = x.buf + ((size_t)r * c + ch) * 3;
        chan_merge(n, mean, m2, t[0], t[1], t[2]);
    }
    bn_stats_out(c, ch, n, mean, m2, momentum, eps, running_mean, running_var, save_mean, save_invstd, gamma, beta,
                 vec);
}

/* The channel of flat index i (32-bit: the launcher checks the count). */
__device__ __forceinline__ uint32_t bn_channel(uint32_t i, uint32_t c, uint32_t hw, bool nhwc) {
    return nhwc ? i % c : (i / hw) % c;
}

template <typename T, bool NHWC>
__global__ void bn_apply_kernel(uint32_t count, int c, int hw, const T *x, const float *gamma,
                                const float *beta, const float *mean, const float *invstd, int relu,
                                T *y) {
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        const uint32_t ch = bn_channel(i, c, hw, NHWC);
        float v = (to_f(x[i]) - mean[ch]) * (invstd[ch] * gamma[ch]) + beta[ch];
        y[i] = from_f<T>(relu && v < 0.f ? 0.f : v);
    }
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

/* Backward partials: Σ g and Σ g·x̂ per chunk, g = dy (masked by y > 0 when the ReLU is fused). */
template <typename T, bool NHWC>
__global__ void __launch_bounds__(BN_THREADS)
    bn_partial_grad_kernel(BnPlan pl, int c, int hw, const T *x, const T *y, const T *dy,
                           const float *save_mean, const float *save_invstd, int relu, float *part) {
    __shared__ float sa[BN_THREADS], sb[BN_THREADS];
    uint32_t lane, lanes;
    int slot;
    const int ch = bn_thread(NHWC, c, lane, lanes, slot);
    const uint32_t g = blockIdx.x, lo = pl.lo(g), hi = pl.lo(g + 1);
    float sdy = 0.f, sdyx = 0.f;
    if (ch >= 0) {
        const float mean = save_mean[ch], invstd = save_invstd[ch];
        for (uint32_t k = lo + lane; k < hi; k += lanes) {
            const uint64_t at = bn_idx(k, c, hw, ch, NHWC);
            float d = relu && !(to_f(y[at]) > 0.f) ? 0.f : to_f(dy[at]);
            sdy += d;
            sdyx += d * ((to_f(x[at]) - mean) * invstd);
        }
    }
    sa[slot] = sdy, sb[slot] = sdyx;
    BN_TREE(NHWC, lane, lanes, slot, (sa[slot] += sa[o_], sb[slot] += sb[o_]));
    if (lane == 0 && ch >= 0) part[((size_t)g * c + ch) * 2] = sa[slot], part[((size_t)g * c + ch) * 2 + 1] = sb[slot];
}

/* What the elementwise pass needs of channel ch: coef = the means of g and g·x̂ over the n values. */
__device__ __forceinline__ void bn_grad_out(int c, int ch, float n, float sdy, float sdyx, float *coef,
                                            const float *gamma, const float *save_mean, const float *save_invstd,
                                            float *vec) {
    coef[2 * ch] = sdy / n;
    coef[2 * ch + 1] = sdyx / n;
    if (vec) /* the vector apply's operands, channel-contiguous */
        vec[ch] = save_mean[ch], vec[c + ch] = save_invstd[ch], vec[2 * c + ch] = gamma[ch] * save_invstd[ch],
        vec[3 * c + ch] = coef[2 * ch], vec[4 * c + ch] = coef[2 * ch + 1];
}

/* Σ over chunks (lanes per channel as above); dγ, dβ accumulate (parameter gradients always do);
 * coef = the two means the elementwise pass needs — or, under SyncBatchNorm, this rank's sums go to
 * the exchange and the sync kernel below makes coef from every rank's. dγ, dβ stay this rank's. */
__global__ void __launch_bounds__(BN_FIN_THREADS)
    bn_finalize_grad_kernel(BnPlan pl, int c, const float *part, float *dgamma, float *dbeta, float *coef,
                            const float *gamma, const float *save_mean, const float *save_invstd, float *vec,
                            BnExchange x) {
    __shared__ float sa[BN_FIN_THREADS], sb[BN_FIN_THREADS];
    const uint32_t L = blockDim.x, lane = threadIdx.x;
    const int ch = blockIdx.x * blockDim.y + threadIdx.y, t = threadIdx.y * L + lane;
    float sdy = 0.f, sdyx = 0.f;
    if (ch < c)
        for (uint32_t g = lane; g < pl.chunks; g += L)
            sdy += part[((size_t)g * c + ch) * 2], sdyx += part[((size_t)g * c + ch) * 2 + 1];
    sa[t] = sdy, sb[t] = sdyx;
    BN_TREE(false, lane, L, t, (sa[t] += sa[o_], sb[t] += sb[o_]));
    if (ch >= c || lane != 0) return;
    sdy = sa[t], sdyx = sb[t];
    dbeta[ch] += sdy;
    dgamma[ch] += sdyx;
    if (x.buf) bn_exchange_put(x, c, ch, (float)pl.rows, sdy, sdyx);
    else bn_grad_out(c, ch, (float)pl.rows, sdy, sdyx, coef, gamma, save_mean, save_invstd, vec);
}

/* SyncBatchNorm: the ranks' counts and sums added in rank order. */
__global__ void bn_sync_grad_kernel(int c, BnExchange x, float *coef, const float *gamma, const float *save_mean,
                                    const float *save_invstd, float *vec) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c) return;
    float n = 0.f, sdy = 0.f, sdyx = 0.f;
    for (int r = 0; r < x.world; r++) {
        const float *t = x.buf + ((size_t)r * c + ch) * 3;
        n += t[0], sdy += t[1], sdyx += t[2];
    }
    bn_grad_out(c, ch, n, sdy, sdyx, coef, gamma, save_mean, save_invstd, vec);
}

template <typename T, bool NHWC>
__global__ void bn_apply_grad_kernel(uint32_t count, int c, int hw, const T *x, const T *y,
                                     const T *dy, const float *gamma, const float *save_mean,
                                     const float *save_invstd, const float *coef, int relu, T *dx,
                                     int accumulate) {
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        const uint32_t ch = bn_channel(i, c, hw, NHWC);
        const float invstd = save_invstd[ch], xhat = (to_f(x[i]) - save_mean[ch]) * invstd;
        float d = relu && !(to_f(y[i]) > 0.f) ? 0.f : to_f(dy[i]);
        float v = gamma[ch] * invstd * (d - coef[2 * ch] - xhat * coef[2 * ch + 1]);
        dx[i] = from_f<T>(accumulate ? to_f(dx[i]) + v : v);
    }
}

/* ---- batch norm, the channels-last fast path: 16-byte vectors ----------------------------------
 * In NHWC the channels of one row sit next to each other, so one 16-byte load brings V = 16 /
 * sizeof(T) of them (4 in fp32, 8 in 16 bits): a quarter to an eighth of the scalar kernels' memory
 * instructions for the same bytes, and each thread issues BN_UNROLL rows' loads before it uses
 * any, so more bytes are in flight. The forward's statistics take BN_UNROLL rows at a time — their
 * mean and M2, merged into the running pair with Chan's formula: one division per BN_UNROLL rows for
 * all V channels, where Welford divides per value. The apply kernels read per-channel operands the
 * finalize kernels laid out channel-contiguous in the scratch (vec), as float4s.
 * Taken when c % V == 0 and every tensor is 16-byte aligned (the model's arena is); anything else
 * runs the scalar kernels above. Its own chunk plan (bn_vec_plan), the same partial layout and
 * finalize kernels: the order of the float operations differs from the scalar path's, and is still
 * fixed for a given shape and type (bit-reproducible). The 16-byte helpers are at the top. */

/* NHWC vector block: TX threads across a row's vectors (a power of two, at most 8: a warp then reads
 * 4 rows of 128 contiguous bytes, and 512 channels still make 8–16 column blocks — at 32, layer 4's
 * 2,048 rows gave 64 blocks, too few to fill the GPU), TY = 256 / TX rows. */
static dim3 bn_vec_block(int c, int V) {
    int tx = 1;
    while (tx < c / V && tx < 8) tx *= 2;
    return dim3(tx, BN_THREADS / tx);
}

template <typename T>
__global__ void __launch_bounds__(BN_THREADS) bn_partial_stats_vec_kernel(BnPlan pl, int c, const T *x, float *part) {
    constexpr int V = VecOf<T>::N;
    __shared__ float s_n[BN_THREADS], s_mean[V][BN_THREADS], s_m2[V][BN_THREADS];
    const int TX = blockDim.x, TY = blockDim.y, ty = threadIdx.y, slot = ty * TX + threadIdx.x;
    const int ch0 = (blockIdx.y * TX + threadIdx.x) * V;
    const uint32_t g = blockIdx.x, lo = pl.lo(g), hi = pl.lo(g + 1);
    float n = 0.f, mean[V], m2[V];
#pragma unroll
    for (int j = 0; j < V; j++) mean[j] = m2[j] = 0.f;
    if (ch0 < c) {
        uint32_t k = lo + ty;
        for (; k + (BN_UNROLL - 1) * TY < hi; k += BN_UNROLL * TY) {
            float a[BN_UNROLL][V];
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) vload(x + (size_t)(k + u * TY) * c + ch0, a[u]);
            const float f = (float)BN_UNROLL / (n + (float)BN_UNROLL);
#pragma unroll
            for (int j = 0; j < V; j++) {
                float sum = 0.f, q = 0.f;
#pragma unroll
                for (int u = 0; u < BN_UNROLL; u++) sum += a[u][j];
                const float mb = sum * (1.f / BN_UNROLL);
#pragma unroll
                for (int u = 0; u < BN_UNROLL; u++) q += (a[u][j] - mb) * (a[u][j] - mb);
                const float delta = mb - mean[j]; /* Chan: (n, mean, m2) ⊕ (BN_UNROLL, mb, q) */
                mean[j] += delta * f;
                m2[j] += q + delta * delta * n * f;
            }
            n += (float)BN_UNROLL;
        }
        for (; k < hi; k += TY) { /* the rest, one row at a time (Welford) */
            float a[V];
            vload(x + (size_t)k * c + ch0, a);
            n += 1.f;
            const float f = 1.f / n;
#pragma unroll
            for (int j = 0; j < V; j++) {
                const float d = a[j] - mean[j];
                mean[j] += d * f;
                m2[j] += d * (a[j] - mean[j]);
            }
        }
    }
    s_n[slot] = n;
#pragma unroll
    for (int j = 0; j < V; j++) s_mean[j][slot] = mean[j], s_m2[j][slot] = m2[j];
    for (int half = TY / 2; half > 0; half /= 2) { /* fixed-order tree over the rows */
        __syncthreads();
        if (ty < half) {
            const int o = slot + half * TX;
            const float na = s_n[slot], nb = s_n[o];
            if (nb > 0.f) {
                const float f = nb / (na + nb);
#pragma unroll
                for (int j = 0; j < V; j++) {
                    const float delta = s_mean[j][o] - s_mean[j][slot];
                    s_mean[j][slot] += delta * f;
                    s_m2[j][slot] += s_m2[j][o] + delta * delta * na * f;
                }
                s_n[slot] = na + nb;
            }
        }
    }
    __syncthreads();
    if (ty == 0 && ch0 < c)
#pragma unroll
        for (int j = 0; j < V; j++)
            part[((size_t)g * c + ch0 + j) * 2] = s_mean[j][slot], part[((size_t)g * c + ch0 + j) * 2 + 1] = s_m2[j][slot];
}

/* y = (x − mean)·(invstd·γ) + β, V channels a thread; vec = [mean | invstd·γ | β] from the finalize. */
template <typename T>
__global__ void bn_apply_vec_kernel(uint32_t nvec, int c, const T *x, const float *vec, int relu, T *y) {
    constexpr int V = VecOf<T>::N;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += gridDim.x * blockDim.x) {
        const uint32_t ch0 = (i * V) % (uint32_t)c;
        float a[V], m[V], sc[V], b[V];
        vload(x + (size_t)i * V, a);
        vloadf<V>(vec + ch0, m), vloadf<V>(vec + c + ch0, sc), vloadf<V>(vec + 2 * c + ch0, b);
#pragma unroll
        for (int j = 0; j < V; j++) {
            const float v = (a[j] - m[j]) * sc[j] + b[j];
            a[j] = relu && v < 0.f ? 0.f : v;
        }
        vstore(y + (size_t)i * V, a);
    }
}

/* Backward partials, V channels a thread: Σ g and Σ g·x̂ (g = dy, masked by y > 0 with the ReLU). */
template <typename T>
__global__ void __launch_bounds__(BN_THREADS)
    bn_partial_grad_vec_kernel(BnPlan pl, int c, const T *x, const T *y, const T *dy, const float *save_mean,
                               const float *save_invstd, int relu, float *part) {
    constexpr int V = VecOf<T>::N;
    __shared__ float s_a[V][BN_THREADS], s_b[V][BN_THREADS];
    const int TX = blockDim.x, TY = blockDim.y, ty = threadIdx.y, slot = ty * TX + threadIdx.x;
    const int ch0 = (blockIdx.y * TX + threadIdx.x) * V;
    const uint32_t g = blockIdx.x, lo = pl.lo(g), hi = pl.lo(g + 1);
    float sdy[V], sdyx[V], mean[V], invstd[V];
#pragma unroll
    for (int j = 0; j < V; j++) sdy[j] = sdyx[j] = 0.f, mean[j] = invstd[j] = 0.f;
    if (ch0 < c) {
#pragma unroll
        for (int j = 0; j < V; j++) mean[j] = save_mean[ch0 + j], invstd[j] = save_invstd[ch0 + j];
        uint32_t k = lo + ty;
        for (; k + (BN_UNROLL - 1) * TY < hi; k += BN_UNROLL * TY) {
            float ax[BN_UNROLL][V], ady[BN_UNROLL][V], ay[BN_UNROLL][V];
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++) {
                const size_t at = (size_t)(k + u * TY) * c + ch0;
                vload(x + at, ax[u]), vload(dy + at, ady[u]);
                if (relu) vload(y + at, ay[u]);
            }
#pragma unroll
            for (int u = 0; u < BN_UNROLL; u++)
#pragma unroll
                for (int j = 0; j < V; j++) {
                    const float d = relu && !(ay[u][j] > 0.f) ? 0.f : ady[u][j];
                    sdy[j] += d;
                    sdyx[j] += d * ((ax[u][j] - mean[j]) * invstd[j]);
                }
        }
        for (; k < hi; k += TY) {
            const size_t at = (size_t)k * c + ch0;
            float ax[V], ady[V], ay[V];
            vload(x + at, ax), vload(dy + at, ady);
            if (relu) vload(y + at, ay);
#pragma unroll
            for (int j = 0; j < V; j++) {
                const float d = relu && !(ay[j] > 0.f) ? 0.f : ady[j];
                sdy[j] += d;
                sdyx[j] += d * ((ax[j] - mean[j]) * invstd[j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < V; j++) s_a[j][slot] = sdy[j], s_b[j][slot] = sdyx[j];
    for (int half = TY / 2; half > 0; half /= 2) {
        __syncthreads();
        if (ty < half) {
            const int o = slot + half * TX;
#pragma unroll
            for (int j = 0; j < V; j++) s_a[j][slot] += s_a[j][o], s_b[j][slot] += s_b[j][o];
        }
    }
    __syncthreads();
    if (ty == 0 && ch0 < c)
#pragma unroll
        for (int j = 0; j < V; j++)
            part[((size_t)g * c + ch0 + j) * 2] = s_a[j][slot], part[((size_t)g * c + ch0 + j) * 2 + 1] = s_b[j][slot];
}

/* dx = γ·invstd·(g − mean(g) − x̂·mean(g·x̂)), V channels a thread; vec = [mean | invstd | γ·invstd |
 * mean(g) | mean(g·x̂)] from the finalize (the scalar kernel's operands, so the same arithmetic). */
template <typename T>
__global__ void bn_apply_grad_vec_kernel(uint32_t nvec, int c, const T *x, const T *y, const T *dy,
                                         const float *vec, int relu, T *dx, int accumulate) {
    constexpr int V = VecOf<T>::N;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += gridDim.x * blockDim.x) {
        const uint32_t ch0 = (i * V) % (uint32_t)c;
        const size_t at = (size_t)i * V;
        float ax[V], ady[V], ay[V], o[V], m[V], is[V], k1[V], c0[V], c1[V];
        vload(x + at, ax), vload(dy + at, ady);
        if (relu) vload(y + at, ay);
        if (accumulate) vload(dx + at, o);
        vloadf<V>(vec + ch0, m), vloadf<V>(vec + c + ch0, is), vloadf<V>(vec + 2 * c + ch0, k1);
        vloadf<V>(vec + 3 * c + ch0, c0), vloadf<V>(vec + 4 * c + ch0, c1);
#pragma unroll
        for (int j = 0; j < V; j++) {
            const float xhat = (ax[j] - m[j]) * is[j];
            const float d = relu && !(ay[j] > 0.f) ? 0.f : ady[j];
            const float v = k1[j] * (d - c0[j] - xhat * c1[j]);
            o[j] = accumulate ? o[j] + v : v;
        }
        vstore(dx + at, o);
    }
}

/* ---- GradScaler ------------------------------------------------------------------------------ */

__global__ void scale_by_device_kernel(int64_t count, float *x, const float *alpha) {
    GRID_STRIDE(i, count) x[i] *= *alpha;
}
/* The same, 16 bytes a thread (the same products: the same bits): clipping scales the whole gradient. */
__global__ void scale_by_device_vec_kernel(int64_t count, float *x, const float *alpha) {
    const float a = *alpha;
    GRID_STRIDE(v, count / 4) {
        float f[4];
        vload(x + 4 * v, f);
#pragma unroll
        for (int j = 0; j < 4; j++) f[j] *= a;
        vstore(x + 4 * v, f);
    }
    VEC_TAIL(k, count, 4) x[k] *= a;
}

/* As torch's _amp_non_finite_check_and_unscale_: the check is on the scaled value; every thread
 * that sees one writes the same 1.0 (a benign race, no atomics needed). */
__global__ void amp_unscale_check_kernel(int64_t count, float *g, const float *inv_scale,
                                         float *found_inf) {
    const float inv = *inv_scale;
    GRID_STRIDE(i, count) {
        float v = g[i];
        if (!isfinite(v) || !isfinite(inv)) *found_inf = 1.f; /* an inf 1/scale: see ref_amp_unscale_check */
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

/* Σ v over the block, in a fixed tree (float counts, or the clip norm's double partial sums). */
template <typename T> __device__ T block_sum(T v, T *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? sh[lane] : T(0);
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    T total = sh[0];
    __syncthreads(); /* sh is reused by the next call */
    return total;
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

/* clip_grad_norm_'s first pass: a fixed number of blocks (ops.h: CLIP_PARTS), each the sum of its
 * grid-stride share of g², in double (a float sum of 11 M squares would lose digits; fp64 costs
 * nothing in a kernel that waits for memory), 16 bytes a load where g is aligned (the flat gradient
 * buffer is). No atomics: the partial sums are added in one fixed order by the next kernel, so the
 * norm's bits never change from run to run (--deterministic needs nothing more). */
__global__ void clip_sumsq_kernel(int64_t count, const float *g, int vec, double *partials) {
    __shared__ double sh[32];
    double acc = 0.0;
    if (vec) {
        GRID_STRIDE(v, count / 4) {
            float f[4];
            vload(g + 4 * v, f);
#pragma unroll
            for (int j = 0; j < 4; j++) acc += (double)f[j] * (double)f[j];
        }
        VEC_TAIL(k, count, 4) acc += (double)g[k] * (double)g[k];
    } else {
        GRID_STRIDE(i, count) acc += (double)g[i] * (double)g[i];
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

/* One block: the partial sums added in a fixed order (each thread its strided share, then the block's
 * tree), then, on thread 0, the norm and torch's coefficient, op for op — clip_coef = max_norm /
 * (total_norm + 1e-6) is Tensor.__rtruediv__, i.e. reciprocal() * max_norm, in fp32; clamp(max=1) keeps
 * a NaN. */
__global__ void clip_coef_kernel(const double *partials, int parts, float max_norm, float *norm,
                                 float *coef, int64_t *clipped) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += partials[i];
    s = block_sum(s, sh);
    if (threadIdx.x != 0) return;
    const float n = s > FLT_MAX ? INFINITY : (float)sqrt(s); /* torch's fp32 squares overflow: ops_ref.c */
    float c = (1.0f / (n + 1e-6f)) * max_norm;
    if (c > 1.0f) c = 1.0f;
    *norm = n;
    *coef = c;
    if (c < 1.0f && isfinite(n)) *clipped += 1; /* an inf norm (a step the GradScaler skips) is not counted */
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

/* ---- typed: p = 0 → float, 1 → __half, 2 → __nv_bfloat16 ------------------------------------- */

/* Calls f with a value of the element type that p names, so one launch line serves all three. */
extern "C++" {
template <typename F> static void by_type(int p, F f) {
    if (p == 0) f(float());
    else if (p == 1) f(__half());
    else f(__nv_bfloat16());
}
}
#define TYPED(p, ...) by_type(p, [&](auto tag_) { using T = decltype(tag_); __VA_ARGS__; })
#define PT(ptr) ((T *)(ptr))
#define PCT(ptr) ((const T *)(ptr))

void launch_cast_to(cudaStream_t s, int p, int64_t count, const float *src, void *dst) {
    if (count <= 0) return;
    if (aligned16({src, dst})) {
        TYPED(p, cast_to_vec_kernel<T><<<vec_blocks(count, p), THREADS, 0, s>>>(count, src, PT(dst)));
        return;
    }
    int g = blocks_for(count);
    TYPED(p, cast_to_kernel<T><<<g, THREADS, 0, s>>>(count, src, PT(dst)));
}

void launch_scale_lp(cudaStream_t s, int p, int64_t count, void *x, float alpha) {
    if (count <= 0) return;
    TYPED(p, scale_lp_kernel<T><<<blocks_for(count), THREADS, 0, s>>>(count, PT(x), alpha));
}

void launch_cast_add_clear(cudaStream_t s, int p, int64_t count, void *src, float *dst) {
    if (count <= 0) return;
    if (aligned16({src, dst})) {
        TYPED(p, cast_add_clear_vec_kernel<T><<<vec_blocks(count, p), THREADS, 0, s>>>(count, PT(src), dst));
        return;
    }
    TYPED(p, cast_add_clear_kernel<T><<<blocks_for(count), THREADS, 0, s>>>(count, PT(src), dst));
}

void launch_cast_from(cudaStream_t s, int p, int64_t count, const void *src, float *dst) {
    if (count <= 0) return;
    if (aligned16({src, dst})) {
        TYPED(p, cast_from_vec_kernel<T><<<vec_blocks(count, p), THREADS, 0, s>>>(count, PCT(src), dst));
        return;
    }
    int g = blocks_for(count);
    TYPED(p, cast_from_kernel<T><<<g, THREADS, 0, s>>>(count, PCT(src), dst));
}

void launch_relu_forward_lp(cudaStream_t s, int p, int64_t count, const void *x, void *y) {
    if (count <= 0) return;
    int g = blocks_for(count);
    TYPED(p, relu_forward_lp_kernel<T><<<g, THREADS, 0, s>>>(count, PCT(x), PT(y)));
}

void launch_relu_backward_lp(cudaStream_t s, int p, int64_t count, const void *y, const void *dy,
                             void *dx, int accumulate) {
    if (count <= 0) return;
    int g = blocks_for(count);
    TYPED(p, relu_backward_lp_kernel<T><<<g, THREADS, 0, s>>>(count, PCT(y), PCT(dy), PT(dx), accumulate));
}

void launch_add_forward_lp(cudaStream_t s, int p, int64_t count, const void *a, const void *b,
                           void *y) {
    if (count <= 0) return;
    int g = blocks_for(count);
    TYPED(p, add_forward_lp_kernel<T><<<g, THREADS, 0, s>>>(count, PCT(a), PCT(b), PT(y)));
}

void launch_grad_pass_lp(cudaStream_t s, int p, int64_t count, const void *src, void *dst,
                         int accumulate) {
    if (count <= 0 || (!accumulate && src == dst)) return;
    int g = blocks_for(count);
    TYPED(p, grad_pass_lp_kernel<T><<<g, THREADS, 0, s>>>(count, PCT(src), PT(dst), accumulate));
}

void launch_add_relu_forward(cudaStream_t s, int p, int64_t count, const void *a, const void *b,
                             void *y) {
    if (count <= 0) return;
    if (aligned16({a, b, y})) {
        TYPED(p, add_relu_forward_vec_kernel<T><<<vec_blocks(count, p), THREADS, 0, s>>>(count, PCT(a), PCT(b), PT(y)));
        return;
    }
    int g = blocks_for(count);
    TYPED(p, add_relu_forward_kernel<T><<<g, THREADS, 0, s>>>(count, PCT(a), PCT(b), PT(y)));
}

void launch_add_relu_backward(cudaStream_t s, int p, int64_t count, const void *y, const void *dy,
                              void *da, int acc_a, void *db, int acc_b) {
    if (count <= 0) return;
    if (aligned16({y, dy, da, db})) {
        TYPED(p, add_relu_backward_vec_kernel<T><<<vec_blocks(count, p), THREADS, 0, s>>>(count, PCT(y), PCT(dy), PT(da), acc_a,
                                                                                        PT(db), acc_b));
        return;
    }
    int g = blocks_for(count);
    TYPED(p, add_relu_backward_kernel<T><<<g, THREADS, 0, s>>>(count, PCT(y), PCT(dy), PT(da), acc_a, PT(db), acc_b));
}

void launch_avgpool_forward_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                               void *y) {
    int64_t rows = (int64_t)n * c;
    if (rows <= 0 || hw <= 0) return;
    int g = blocks_for(rows);
    TYPED(p, avgpool_forward_lp_kernel<T><<<g, THREADS, 0, s>>>(rows, c, hw, nhwc, PCT(x), PT(y)));
}

void launch_avgpool_backward_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw,
                                const void *dy, void *dx, int accumulate) {
    int64_t count = (int64_t)n * c * hw;
    if (count <= 0) return;
    int g = blocks_for(count);
    TYPED(p, avgpool_backward_lp_kernel<T><<<g, THREADS, 0, s>>>(count, c, hw, nhwc, PCT(dy), PT(dx), accumulate));
}

void launch_cast_to_nhwc(cudaStream_t s, int p, int n, int c, int hw, const float *src, void *dst) {
    int64_t count = (int64_t)n * c * hw;
    if (count <= 0) return;
    int g = blocks_for(count);
    TYPED(p, cast_to_nhwc_kernel<T><<<g, THREADS, 0, s>>>(count, c, hw, src, PT(dst)));
}

void launch_bias_fill_lp(cudaStream_t s, int p, int n, int out, const void *b, void *y) {
    int64_t count = (int64_t)n * out;
    if (count <= 0) return;
    int g = blocks_for(count);
    TYPED(p, bias_fill_lp_kernel<T><<<g, THREADS, 0, s>>>(count, out, PCT(b), PT(y)));
}

void launch_bias_grad_lp(cudaStream_t s, int p, int n, int out, const void *dy, void *db) {
    if (out <= 0) return;
    int g = blocks_for(out);
    TYPED(p, bias_grad_lp_kernel<T><<<g, THREADS, 0, s>>>(n, out, PCT(dy), PT(db)));
}

/* The vector plan never cuts more chunks than bn_plan (half its target, at least 128 rows a chunk);
 * sizing for the larger of the plans keeps the scratch right by construction if either changes.
 * The size cannot depend on the type (bn_prepare does not know it), so both vector widths count. */
static uint32_t bn_max_chunks(int nhwc, int n, int c, int hw) {
    uint32_t most = bn_plan(nhwc, n, c, hw).chunks;
    if (nhwc && c % 4 == 0) most = std::max(most, bn_vec_plan(n, c, hw, 4, (int)bn_vec_block(c, 4).x).chunks);
    if (nhwc && c % 8 == 0) most = std::max(most, bn_vec_plan(n, c, hw, 8, (int)bn_vec_block(c, 8).x).chunks);
    return most;
}

/* The scratch: the partials (the most chunks either path may cut), then coef (2c), then the vector
 * path's per-channel operands (5c). Its start is 256-byte aligned, and the vector path runs only
 * when 4 | c, so every piece after the partials stays 16-byte aligned. */
size_t launch_bn_scratch_floats(int nhwc, int n, int c, int hw) {
    return (size_t)bn_max_chunks(nhwc, n, c, hw) * c * 2 + (size_t)c * 7;
}

/* The vector path: channels-last, V | c, every tensor 16-byte aligned (NULL: not read). */
static bool bn_vec_ok(int nhwc, int p, int c, std::initializer_list<const void *> tensors) {
    return nhwc && c % vec_width(p) == 0 && aligned16(tensors);
}

/* The three kernels of each pass (see the batch norm section above). */
#define BN_PARTIAL_GRID(pl, nhwc, c) dim3((pl).chunks, (nhwc) ? ((c) + 31) / 32 : (c))
#define BN_PARTIAL_BLOCK(nhwc) ((nhwc) ? dim3(32, BN_ROWS_NHWC) : dim3(BN_THREADS))

/* The finalize kernel of each pass and, under SyncBatchNorm, the exchange and the merge after it. */
static BnExchange bn_no_exchange() { return BnExchange{nullptr, nullptr, 0, 1, nullptr}; }

static void bn_finish_stats(cudaStream_t s, const BnPlan &pl, int c, const float *part, float momentum, float eps,
                            float *running_mean, float *running_var, float *save_mean, float *save_invstd,
                            const float *gamma, const float *beta, float *vec, const BnExchange *sync) {
    const dim3 fb = bn_fin_block(pl.chunks);
    bn_finalize_stats_kernel<<<bn_fin_grid(c, fb), fb, 0, s>>>(pl, c, part, momentum, eps, running_mean, running_var,
                                                               save_mean, save_invstd, gamma, beta, vec,
                                                               sync ? *sync : bn_no_exchange());
    if (!sync) return;
    sync->sum(sync->ctx, sync->buf, (int64_t)sync->world * 3 * c);
    bn_sync_stats_kernel<<<(c + 127) / 128, 128, 0, s>>>(c, *sync, momentum, eps, running_mean, running_var,
                                                         save_mean, save_invstd, gamma, beta, vec);
}

static void bn_finish_grad(cudaStream_t s, const BnPlan &pl, int c, const float *part, float *dgamma, float *dbeta,
                           float *coef, const float *gamma, const float *save_mean, const float *save_invstd,
                           float *vec, const BnExchange *sync) {
    const dim3 fb = bn_fin_block(pl.chunks);
    bn_finalize_grad_kernel<<<bn_fin_grid(c, fb), fb, 0, s>>>(pl, c, part, dgamma, dbeta, coef, gamma, save_mean,
                                                              save_invstd, vec, sync ? *sync : bn_no_exchange());
    if (!sync) return;
    sync->sum(sync->ctx, sync->buf, (int64_t)sync->world * 3 * c);
    bn_sync_grad_kernel<<<(c + 127) / 128, 128, 0, s>>>(c, *sync, coef, gamma, save_mean, save_invstd, vec);
}

void launch_bn_forward_train_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                                const float *gamma, const float *beta, float *running_mean,
                                float *running_var, float momentum, float eps, float *save_mean,
                                float *save_invstd, void *y, int relu, float *scratch, const BnExchange *sync) {
    const uint32_t count = (uint32_t)n * c * hw; /* ops_cuda.c checks it fits */
    if (c <= 0 || count == 0) return;
    if (bn_vec_ok(nhwc, p, c, {x, y, scratch})) {
        const int V = vec_width(p);
        const dim3 block = bn_vec_block(c, V);
        const BnPlan pl = bn_vec_plan(n, c, hw, V, (int)block.x);
        const dim3 grid(pl.chunks, (c / V + block.x - 1) / block.x);
        float *vec = scratch + (size_t)pl.chunks * c * 2 + (size_t)c * 2;
        TYPED(p, bn_partial_stats_vec_kernel<T><<<grid, block, 0, s>>>(pl, c, PCT(x), scratch));
        bn_finish_stats(s, pl, c, scratch, momentum, eps, running_mean, running_var, save_mean, save_invstd, gamma,
                        beta, vec, sync);
        const uint32_t nvec = count / V;
        TYPED(p, bn_apply_vec_kernel<T><<<blocks_for(nvec), THREADS, 0, s>>>(nvec, c, PCT(x), vec, relu, PT(y)));
        return;
    }
    const BnPlan pl = bn_plan(nhwc, n, c, hw);
    const dim3 grid = BN_PARTIAL_GRID(pl, nhwc, c), block = BN_PARTIAL_BLOCK(nhwc);
    if (nhwc) TYPED(p, bn_partial_stats_kernel<T, true><<<grid, block, 0, s>>>(pl, c, hw, PCT(x), scratch));
    else TYPED(p, bn_partial_stats_kernel<T, false><<<grid, block, 0, s>>>(pl, c, hw, PCT(x), scratch));
    bn_finish_stats(s, pl, c, scratch, momentum, eps, running_mean, running_var, save_mean, save_invstd, gamma, beta,
                    nullptr, sync);
    const int g = blocks_for(count);
    if (nhwc) TYPED(p, bn_apply_kernel<T, true><<<g, THREADS, 0, s>>>(count, c, hw, PCT(x), gamma, beta, save_mean, save_invstd, relu, PT(y)));
    else TYPED(p, bn_apply_kernel<T, false><<<g, THREADS, 0, s>>>(count, c, hw, PCT(x), gamma, beta, save_mean, save_invstd, relu, PT(y)));
}

void launch_bn_forward_eval_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                               const float *gamma, const float *beta, const float *running_mean,
                               const float *running_var, float eps, void *y) {
    int64_t count = (int64_t)n * c * hw;
    if (count <= 0) return;
    int g = blocks_for(count);
    TYPED(p, bn_forward_eval_lp_kernel<T><<<g, THREADS, 0, s>>>(count, nhwc, c, hw, PCT(x), gamma, beta,
                                                              running_mean, running_var, eps, PT(y)));
}

void launch_bn_backward_lp(cudaStream_t s, int p, int nhwc, int n, int c, int hw, const void *x,
                           const void *y, const void *dy, const float *gamma, const float *save_mean,
                           const float *save_invstd, void *dx, float *dgamma, float *dbeta,
                           int accumulate, int relu, float *scratch, const BnExchange *sync) {
    const uint32_t count = (uint32_t)n * c * hw;
    if (c <= 0 || count == 0) return;
    if (bn_vec_ok(nhwc, p, c, {x, relu ? y : nullptr, dy, dx, scratch})) {
        const int V = vec_width(p);
        const dim3 block = bn_vec_block(c, V);
        const BnPlan pl = bn_vec_plan(n, c, hw, V, (int)block.x);
        const dim3 grid(pl.chunks, (c / V + block.x - 1) / block.x);
        float *coef = scratch + (size_t)pl.chunks * c * 2, *vec = coef + (size_t)c * 2;
        TYPED(p, bn_partial_grad_vec_kernel<T><<<grid, block, 0, s>>>(pl, c, PCT(x), PCT(y), PCT(dy), save_mean,
                                                                      save_invstd, relu, scratch));
        bn_finish_grad(s, pl, c, scratch, dgamma, dbeta, coef, gamma, save_mean, save_invstd, vec, sync);
        const uint32_t nvec = count / V;
        TYPED(p, bn_apply_grad_vec_kernel<T><<<blocks_for(nvec), THREADS, 0, s>>>(nvec, c, PCT(x), PCT(y), PCT(dy), vec,
                                                                                relu, PT(dx), accumulate));
        return;
    }
    const BnPlan pl = bn_plan(nhwc, n, c, hw);
    const dim3 grid = BN_PARTIAL_GRID(pl, nhwc, c), block = BN_PARTIAL_BLOCK(nhwc);
    float *coef = scratch + (size_t)pl.chunks * c * 2;
    if (nhwc) TYPED(p, bn_partial_grad_kernel<T, true><<<grid, block, 0, s>>>(pl, c, hw, PCT(x), PCT(y), PCT(dy), save_mean, save_invstd, relu, scratch));
    else TYPED(p, bn_partial_grad_kernel<T, false><<<grid, block, 0, s>>>(pl, c, hw, PCT(x), PCT(y), PCT(dy), save_mean, save_invstd, relu, scratch));
    bn_finish_grad(s, pl, c, scratch, dgamma, dbeta, coef, gamma, save_mean, save_invstd, nullptr, sync);
    const int g = blocks_for(count);
    if (nhwc) TYPED(p, bn_apply_grad_kernel<T, true><<<g, THREADS, 0, s>>>(count, c, hw, PCT(x), PCT(y), PCT(dy), gamma, save_mean, save_invstd, coef, relu, PT(dx), accumulate));
    else TYPED(p, bn_apply_grad_kernel<T, false><<<g, THREADS, 0, s>>>(count, c, hw, PCT(x), PCT(y), PCT(dy), gamma, save_mean, save_invstd, coef, relu, PT(dx), accumulate));
}

/* ---- GradScaler ------------------------------------------------------------------------------ */

void launch_scale_by_device(cudaStream_t s, int64_t count, float *x, const float *alpha) {
    if (count <= 0) return;
    if (aligned16({x}))
        scale_by_device_vec_kernel<<<vec_blocks(count, 0), THREADS, 0, s>>>(count, x, alpha);
    else
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

void launch_clip_norm_coef(cudaStream_t s, int64_t count, const float *g, double *partials, int parts,
                           float max_norm, float *norm, float *coef, int64_t *clipped) {
    clip_sumsq_kernel<<<parts, THREADS, 0, s>>>(count, g, aligned16({g}), partials);
    clip_coef_kernel<<<1, THREADS, 0, s>>>(partials, parts, max_norm, norm, coef, clipped);
}

} /* extern "C" */
