/* optim.c — SGD over flat buffers and the learning-rate schedule (see optim.h). */
#include "optim.h"

#include <math.h>
#include <string.h>

#include "ops.h"

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
}

void optim_step(Optimizer *o, float *params, const float *grads, double lr_now) {
    sgd_step(o->dev, o->count, params, grads, o->momentum_buf, (float)lr_now, (float)o->momentum,
             (float)o->weight_decay, o->steps == 0);
    o->steps++;
}

void optim_step_unless(Optimizer *o, float *params, const float *grads, double lr_now,
                       const float *skip) {
    sgd_step_unless(o->dev, o->count, params, grads, o->momentum_buf, (float)lr_now,
                    (float)o->momentum, (float)o->weight_decay, o->steps == 0, skip);
    o->steps++;
}

double lr_schedule(const char *schedule, double lr, int64_t step, int64_t total_steps) {
    if (!strcmp(schedule, "cosine") && total_steps > 0)
        return lr * 0.5 * (1.0 + cos(M_PI * (double)step / (double)total_steps));
    return lr;
}
