/* adam.cu — torch.optim.Adam's per-element update on the GPU (see adam.h and adam.c's reference).
 * The __f*_rn / __d*_rn intrinsics keep nvcc from fusing what PyTorch rounds separately; the fmaf
 * calls are the fused multiply-adds PyTorch's kernels do use: the same bits as the CPU reference. */
#include <stdint.h>

#include "adam.h"

static __device__ void adam_update(int64_t count, float *p, const float *g, float *m, float *v, float wd,
                                   float w1, float beta2, float w2, double inv_bias2_sqrt, float eps,
                                   float neg_step) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        float pi = p[i], gi = g[i];
        if (wd != 0.f) gi = fmaf(pi, wd, gi);
        float mi = fmaf(w1, __fsub_rn(gi, m[i]), m[i]);
        float vi = fmaf(__fmul_rn(w2, gi), gi, __fmul_rn(v[i], beta2));
        float denom = __fadd_rn(__double2float_rn(__dmul_rn((double)__fsqrt_rn(vi), inv_bias2_sqrt)), eps);
        m[i] = mi, v[i] = vi;
        p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(neg_step, mi), denom));
    }
}

static __global__ void adam_kernel(int64_t count, float *p, const float *g, float *m, float *v, float wd,
                                   float w1, float beta2, float w2, double inv_bias2_sqrt, float eps,
                                   float neg_step) {
    adam_update(count, p, g, m, v, wd, w1, beta2, w2, inv_bias2_sqrt, eps, neg_step);
}

/* One thread: the step count and the scalars, as adam.c's scalars_of computes them on the host (in
 * double; sqrt is correctly rounded, as the host's pow(x, 0.5) is). Skipped: nothing changes. */
static __global__ void adam_prepare_kernel(int64_t *steps, AdamScalars *sc, const float *skip, double lr,
                                           double beta1, double beta2) {
    if (*skip != 0.f) {
        sc->active = 0;
        return;
    }
    int64_t s = ++*steps;
    double bias1 = 1.0 - pow(beta1, (double)s), bias2 = 1.0 - pow(beta2, (double)s);
    sc->neg_step_size = __double2float_rn(-__ddiv_rn(lr, bias1));
    sc->inv_bias2_sqrt = __ddiv_rn(1.0, (double)__double2float_rn(__dsqrt_rn(bias2)));
    sc->active = 1;
}

static __global__ void adam_unless_kernel(int64_t count, float *p, const float *g, float *m, float *v, float wd,
                                          float w1, float beta2, float w2, float eps, const AdamScalars *sc) {
    if (!sc->active) return;
    adam_update(count, p, g, m, v, wd, w1, beta2, w2, sc->inv_bias2_sqrt, eps, sc->neg_step_size);
}

extern "C" void launch_adam_step(cudaStream_t s, int64_t count, float *params, const float *grads,
                                 float *m, float *v, float wd, float one_minus_beta1, float beta2,
                                 float one_minus_beta2, double inv_bias2_sqrt, float eps,
                                 float neg_step_size) {
    if (count <= 0) return;
    int64_t blocks = (count + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    adam_kernel<<<(unsigned)blocks, 256, 0, s>>>(count, params, grads, m, v, wd, one_minus_beta1, beta2,
                                                 one_minus_beta2, inv_bias2_sqrt, eps, neg_step_size);
}

extern "C" void launch_adam_step_unless(cudaStream_t s, int64_t count, float *params, const float *grads, float *m,
                                        float *v, float wd, float one_minus_beta1, float beta2,
                                        float one_minus_beta2, float eps, double lr, double beta1_d, double beta2_d,
                                        int64_t *steps, AdamScalars *scalars, const float *skip) {
    adam_prepare_kernel<<<1, 1, 0, s>>>(steps, scalars, skip, lr, beta1_d, beta2_d);
    if (count <= 0) return;
    int64_t blocks = (count + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    adam_unless_kernel<<<(unsigned)blocks, 256, 0, s>>>(count, params, grads, m, v, wd, one_minus_beta1, beta2,
                                                        one_minus_beta2, eps, scalars);
}
