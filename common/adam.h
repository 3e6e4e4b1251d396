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
 * Fixture-tested against torch.optim.Adam (tests/torch/make_adam_fixture.py, tests/test_adam.c).
 *
 * Under the GradScaler (stage 5, fp16) a step may be skipped, and only the device knows: then the
 * update goes as torch's fused Adam with found_inf goes — the step count lives on the device, a
 * skipped step leaves it (and everything else) alone, and the bias corrections are computed there
 * from it (adam_step_unless). */
#ifndef ADAM_H
#define ADAM_H

#include <stdint.h>

/* What adam_step_unless's first kernel leaves for its second: whether to step, and the scalars. */
typedef struct AdamScalars {
    int64_t active;   /* 0: skipped */
    double inv_bias2_sqrt;
    float neg_step_size, pad;
} AdamScalars;

#ifndef __CUDACC__ /* adam.cu sees only its launchers (and AdamScalars) */
#include "device.h"

typedef struct Adam {
    double beta1, beta2, eps;
    float *exp_avg, *exp_avg_sq; /* device, count floats each, zeroed at creation */
    int64_t *steps_dev;          /* device: steps taken, for adam_step_unless (torch's state "step") */
    AdamScalars *scalars;        /* device scratch of adam_step_unless */
    int steps_on_device;         /* 1 once adam_step_unless has run: *steps_dev is the count */
} Adam;

#define ADAM_BETA1 0.9  /* torch.optim.Adam's defaults */
#define ADAM_BETA2 0.999
#define ADAM_EPS 1e-8

/* One Adam step over count floats on d; `step` is the step number after the increment (1 first). */
void adam_step(Device *d, int64_t count, float *params, const float *grads, float *exp_avg,
               float *exp_avg_sq, double lr, double beta1, double beta2, double eps,
               double weight_decay, int64_t step);
/* The same step unless *skip != 0 (device flag: the GradScaler's found_inf). *steps (device) counts
 * the steps taken: +1 and the update when not skipped, nothing at all when skipped. scalars: device
 * scratch. No host synchronisation. */
void adam_step_unless(Device *d, int64_t count, float *params, const float *grads, float *exp_avg,
                      float *exp_avg_sq, double lr, double beta1, double beta2, double eps,
                      double weight_decay, int64_t *steps, AdamScalars *scalars, const float *skip);
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
/* adam.cu: adam_step_unless's two kernels (the scalars from the device step count, then the update). */
void launch_adam_step_unless(cudaStream_t s, int64_t count, float *params, const float *grads, float *m,
                             float *v, float wd, float one_minus_beta1, float beta2, float one_minus_beta2,
                             float eps, double lr, double beta1_d, double beta2_d, int64_t *steps,
                             AdamScalars *scalars, const float *skip);
#ifdef __cplusplus
}
#endif
#endif

#endif
