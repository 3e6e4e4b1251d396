/* adam.c — torch.optim.Adam's update (see adam.h): the scalars, the CPU reference, the dispatch. */
#include "adam.h"

#include <math.h>

#include "errors.h"

/* Element i, rounded to float32 exactly where PyTorch's CPU kernels round (checked bit for bit
 * against them): add with alpha, lerp and addcmul are fused multiply-adds (vec::fmadd); division by
 * a Python float is a multiplication by its reciprocal, taken in double; addcdiv is not fused. */
static void adam_ref(int64_t count, float *p, const float *g, float *m, float *v, float wd, float w1,
                     float beta2, float w2, double inv_bias2_sqrt, float eps, float neg_step) {
    for (int64_t i = 0; i < count; i++) {
        float gi = wd != 0.f ? fmaf(p[i], wd, g[i]) : g[i];       /* grad.add(param, alpha=wd) */
        m[i] = fmaf(w1, gi - m[i], m[i]);                         /* exp_avg.lerp_(grad, 1 − β1) */
        v[i] = fmaf(w2 * gi, gi, v[i] * beta2);                   /* .mul_(β2).addcmul_(g, g, 1 − β2) */
        float denom = (float)((double)sqrtf(v[i]) * inv_bias2_sqrt) + eps; /* sqrt() / bc2_sqrt + eps */
        p[i] = p[i] + neg_step * m[i] / denom;                    /* addcdiv_(m, denom, −step_size) */
    }
}

/* The step's scalars from its number (the step after the increment), as torch computes them in
 * Python doubles; adam.cu's adam_prepare_kernel does the same on the device. */
static void scalars_of(int64_t step, double lr, double beta1, double beta2, float *neg_step, double *inv_b2) {
    double bias1 = 1.0 - pow(beta1, (double)step), bias2 = 1.0 - pow(beta2, (double)step);
    double step_size = lr / bias1, bias2_sqrt = pow(bias2, 0.5); /* Python: bias_correction2**0.5 */
    *neg_step = (float)-step_size;
    *inv_b2 = 1.0 / (double)(float)bias2_sqrt; /* the scalar as a float, its reciprocal in double */
}

void adam_step(Device *d, int64_t count, float *params, const float *grads, float *exp_avg,
               float *exp_avg_sq, double lr, double beta1, double beta2, double eps,
               double weight_decay, int64_t step) {
    ASSERT(step >= 1);
    float neg_step, wd = (float)weight_decay, w1 = (float)(1.0 - beta1), b2 = (float)beta2, w2 = (float)(1.0 - beta2);
    double inv_b2;
    scalars_of(step, lr, beta1, beta2, &neg_step, &inv_b2);
    if (d->kind == DEV_CPU) {
        adam_ref(count, params, grads, exp_avg, exp_avg_sq, wd, w1, b2, w2, inv_b2, (float)eps, neg_step);
        return;
    }
#ifdef USE_CUDA
    launch_adam_step(d->stream, count, params, grads, exp_avg, exp_avg_sq, wd, w1, b2, w2, inv_b2,
                     (float)eps, neg_step);
    CHECK_LAUNCH();
#else
    die_at(__FILE__, __LINE__, "adam_step", "this binary was built without CUDA", "run with --device cpu");
#endif
}

void adam_step_unless(Device *d, int64_t count, float *params, const float *grads, float *exp_avg,
                      float *exp_avg_sq, double lr, double beta1, double beta2, double eps,
                      double weight_decay, int64_t *steps, AdamScalars *scalars, const float *skip) {
    float wd = (float)weight_decay, w1 = (float)(1.0 - beta1), b2 = (float)beta2, w2 = (float)(1.0 - beta2);
    if (d->kind == DEV_CPU) {
        if (*skip != 0.f) return; /* skipped: not even the count moves (torch's fused Adam: step −= found_inf) */
        scalars_of(++*steps, lr, beta1, beta2, &scalars->neg_step_size, &scalars->inv_bias2_sqrt);
        adam_ref(count, params, grads, exp_avg, exp_avg_sq, wd, w1, b2, w2, scalars->inv_bias2_sqrt, (float)eps,
                 scalars->neg_step_size);
        return;
    }
#ifdef USE_CUDA
    launch_adam_step_unless(d->stream, count, params, grads, exp_avg, exp_avg_sq, wd, w1, b2, w2, (float)eps, lr,
                            beta1, beta2, steps, scalars, skip);
    CHECK_LAUNCH();
#else
    die_at(__FILE__, __LINE__, "adam_step_unless", "this binary was built without CUDA", "run with --device cpu");
#endif
}
