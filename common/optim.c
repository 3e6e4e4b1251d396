/* optim.c — SGD over flat buffers and the learning-rate schedule (see optim.h). */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adam.h"
#include "ops.h"
#include "trace.h"

void optim_init(Optimizer *o, Device *dev, int64_t count, double lr, double momentum,
                double weight_decay) {
    *o = (Optimizer){.dev = dev, .count = count, .lr = lr, .momentum = momentum,
                     .weight_decay = weight_decay};
    if (momentum != 0.0) {
        o->momentum_buf = device_alloc(dev, (size_t)count * sizeof(float), "optimizer momentum");
        device_memset0(dev, o->momentum_buf, (size_t)count * sizeof(float));
    }
}

void optim_destroy(Optimizer *o) {
    if (o->momentum_buf) device_free(o->dev, o->momentum_buf);
    o->momentum_buf = NULL;
    if (o->adam)
        device_free(o->dev, o->adam->exp_avg), device_free(o->dev, o->adam->exp_avg_sq),
            device_free(o->dev, o->adam->steps_dev);
    free(o->adam);
    o->adam = NULL;
}

void optim_step_slice(Optimizer *o, float *params, const float *grads, double lr_now, int64_t off, int64_t count) {
    ASSERT(off >= 0 && count >= 0 && off + count <= o->count);
    if (o->adam) {
        Adam *a = o->adam;
        adam_step(o->dev, count, params + off, grads + off, a->exp_avg + off, a->exp_avg_sq + off, lr_now, a->beta1,
                  a->beta2, a->eps, o->weight_decay, o->steps + 1);
    } else {
        sgd_step(o->dev, count, params + off, grads + off, o->momentum_buf ? o->momentum_buf + off : NULL,
                 (float)lr_now, (float)o->momentum, (float)o->weight_decay, o->steps == 0);
    }
}

void optim_slices_done(Optimizer *o) { o->steps++; }

void optim_step(Optimizer *o, float *params, const float *grads, double lr_now) {
    TraceDev span = trace_dev_begin(o->dev, TRACE_COMPUTE, NULL, "optimizer", "optimizer", -1);
    optim_step_slice(o, params, grads, lr_now, 0, o->count);
    optim_slices_done(o);
    trace_dev_end(span);
}

void optim_step_unless(Optimizer *o, float *params, const float *grads, double lr_now,
                       const float *skip) {
    if (o->adam) { /* torch's fused Adam with found_inf: the step count, too, moves only on the device */
        Adam *a = o->adam; /* *steps_dev already holds o->steps: zero at init, set with it on resume */
        adam_step_unless(o->dev, o->count, params, grads, a->exp_avg, a->exp_avg_sq, lr_now, a->beta1, a->beta2,
                         a->eps, o->weight_decay, a->steps_dev, a->scalars, skip);
        a->steps_on_device = 1;
        o->steps++;
        return;
    }
    sgd_step_unless(o->dev, o->count, params, grads, o->momentum_buf, (float)lr_now,
                    (float)o->momentum, (float)o->weight_decay, o->steps == 0, skip);
    o->steps++;
}

double lr_schedule(const char *schedule, double lr, int64_t warmup, double start_factor, int64_t step,
                   int64_t total_steps) {
    if (warmup > 0 && step < warmup) /* LinearLR: start_factor → 1 over the warm-up */
        return lr * (start_factor + (1.0 - start_factor) * (double)step / (double)warmup);
    if (warmup > 0) step -= warmup, total_steps -= warmup; /* the main schedule starts at the milestone */
    if (!strcmp(schedule, "cosine") && total_steps > 0)
        return lr * 0.5 * (1.0 + cos(M_PI * (double)step / (double)total_steps));
    return lr;
}

void optim_init_named(Optimizer *o, const char *name, Device *dev, int64_t count, double lr,
                      double momentum, double weight_decay) {
    if (strcmp(name, "adam")) {
        optim_init(o, dev, count, lr, momentum, weight_decay);
        return;
    }
    optim_init(o, dev, count, lr, 0.0, weight_decay);
    Adam *a = o->adam = xcalloc(1, sizeof *a);
    *a = (Adam){.beta1 = ADAM_BETA1, .beta2 = ADAM_BETA2, .eps = ADAM_EPS};
    size_t bytes = (size_t)count * sizeof(float);
    a->exp_avg = device_alloc(dev, bytes, "optimizer exp_avg (adam)");
    a->exp_avg_sq = device_alloc(dev, bytes, "optimizer exp_avg_sq (adam)");
    device_memset0(dev, a->exp_avg, bytes);
    device_memset0(dev, a->exp_avg_sq, bytes);
    /* one block: the step count (int64) and adam_step_unless's scalars */
    a->steps_dev = device_alloc(dev, sizeof(int64_t) + sizeof(AdamScalars), "optimizer step (adam)");
    a->scalars = (AdamScalars *)(a->steps_dev + 1);
    device_memset0(dev, a->steps_dev, sizeof(int64_t) + sizeof(AdamScalars));
}

int64_t optim_adam_steps(Optimizer *o) {
    ASSERT(o->adam);
    if (!o->adam->steps_on_device) return o->steps;
    int64_t n;
    device_copy_d2h(o->dev, &n, o->adam->steps_dev, sizeof n);
    return n;
}

void optim_set_adam_steps(Optimizer *o, int64_t n) {
    ASSERT(o->adam);
    static int64_t v; /* static: the copy may be asynchronous */
    v = n;
    device_copy_h2d(o->dev, o->adam->steps_dev, &v, sizeof v);
    device_sync(o->dev);
    if (!o->adam->steps_on_device) o->steps = n;
}
