/* adam.h — torch.optim.Adam over a flat parameter buffer (--optimizer adam).
 *
 * PyTorch's single-tensor path (torch/optim/adam.py, _single_tensor_adam; amsgrad, maximize and
 * decoupled weight decay off), element by element, in float32, with the scalars computed in double
 * as Python computes them:
 *     step += 1
 *     g  = g + weight_decay·p                          (L2: added to the gradient, not AdamW)
 *     m  = lerp(m, g, 1 − β1)      = m + (1 − β1)·(g − m)
 *     v  = β2·v + (1 − β2)·g·g
 *     bias_correction1 = 1 − β1^step,  bias_correction2 = 1 − β2^step     (double)
 *     step_size = lr / bias_correction1                                   (double)
 *     p  = p − step_size · m / (sqrt(v) / sqrt(bias_correction2) + eps)
 * The two state buffers (exp_avg m, exp_avg_sq v) start at zero and live where the optimizer lives:
 * under DataParallel, on device 0 only — two more copies of the model there and nowhere else.
 * Fixture-tested against torch.optim.Adam (tests/torch/make_adam_fixture.py, tests/test_adam.c). */
#ifndef ADAM_H
#define ADAM_H

#include <stdint.h>

#ifndef __CUDACC__ /* adam.cu sees only its launcher, at the end */
#include "device.h"

typedef struct Adam {
    double beta1, beta2, eps;
    float *exp_avg, *exp_avg_sq; /* device, count floats each, zeroed at creation */
} Adam;

#define ADAM_BETA1 0.9  /* torch.optim.Adam's defaults */
#define ADAM_BETA2 0.999
#define ADAM_EPS 1e-8

/* One Adam step over count floats on d; `step` is the step number after the increment (1 first). */
void adam_step(Device *d, int64_t count, float *params, const float *grads, float *exp_avg,
               float *exp_avg_sq, double lr, double beta1, double beta2, double eps,
               double weight_decay, int64_t step);
#endif

#ifdef USE_CUDA
#include <cuda_runtime.h>
#ifdef __cplusplus
extern "C" {
#endif
/* adam.cu: the per-element update with the host-computed scalars (see adam_step). */
void launch_adam_step(cudaStream_t s, int64_t count, float *params, const float *grads, float *m,
                      float *v, float wd, float one_minus_beta1, float beta2, float one_minus_beta2,
                      double inv_bias2_sqrt, float eps, float neg_step_size);
#ifdef __cplusplus
}
#endif
#endif

#endif
