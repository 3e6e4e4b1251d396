/* kernels.cu — the CUDA kernels that cuDNN/cuBLAS do not give us (see kernels.h).
 *
 * Style: one thread per element in a grid-stride loop (so any count works with a bounded grid),
 * 256 threads per block, int64 indices (a flat parameter buffer may exceed 2^31 floats in
 * principle). Nothing here uses atomics on floats, so every result is bit-reproducible run to run:
 * reductions have one fixed summation order. */
#include <math.h>
#include <stdint.h>

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

__global__ void sgd_kernel(int64_t count, float *params, const float *grads, float *buf, float lr,
                           float momentum, float wd, int first) {
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
                                float lr, float momentum, float wd, int first) {
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
    if (count <= 0) return;
    /* float4 access needs 16-byte aligned pointers and a whole number of float4s. device_alloc'd
     * buffers are aligned; a slice into the middle of one may not be, hence the check. */
    int aligned = ((uintptr_t)params % 16 == 0) && ((uintptr_t)grads % 16 == 0) &&
                  (momentum == 0.f || (uintptr_t)momentum_buf % 16 == 0);
    if (aligned && count % 4 == 0) {
        int64_t count4 = count / 4;
        sgd_kernel_vec4<<<blocks_for(count4), THREADS, 0, s>>>(
            count4, (float4 *)params, (const float4 *)grads, (float4 *)momentum_buf, lr, momentum,
            weight_decay, first);
    } else {
        sgd_kernel<<<blocks_for(count), THREADS, 0, s>>>(count, params, grads, momentum_buf, lr,
                                                         momentum, weight_decay, first);
    }
}

} /* extern "C" */
