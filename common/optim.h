/* optim.h — SGD with momentum and weight decay over a flat parameter buffer (or, with --optimizer
 * adam, Adam: adam.h), and the LR schedule.
 *
 * torch.optim.SGD(params, lr, momentum, weight_decay) with dampening 0 and no Nesterov: the whole
 * model is one flat buffer, so one step is one fused kernel launch (ops.h: sgd_step). The momentum
 * buffer is created lazily by PyTorch on the first step (buf = g); `steps` tells us whether that
 * has happened, and is saved in checkpoints so a resumed run continues exactly. */
#ifndef OPTIM_H
#define OPTIM_H

#include <stdint.h>

#include "device.h"

typedef struct Optimizer {
    Device *dev;
    int64_t count;       /* floats in the flat buffers */
    double lr, momentum, weight_decay;
    float *momentum_buf; /* device, count floats (NULL when momentum == 0) */
    int64_t steps;       /* optimizer steps taken */
    struct Adam *adam;   /* --optimizer adam: its state (adam.h); NULL for SGD */
} Optimizer;

void optim_init(Optimizer *o, Device *dev, int64_t count, double lr, double momentum,
                double weight_decay);
void optim_destroy(Optimizer *o);
/* One optimizer step (SGD, or Adam under --optimizer adam) at learning rate lr_now (from lr_schedule). */
void optim_step(Optimizer *o, float *params, const float *grads, double lr_now);
/* The same step taken slice by slice: optim_step_slice steps floats [off, off + count) of the flat
 * buffers (params, grads and the optimizer's state alike) and counts nothing; optim_slices_done
 * counts the step once all its slices are issued. The update is elementwise, so slices that tile
 * the buffer give optim_step's bits — DDP's --optimizer-overlap steps each bucket this way. */
void optim_step_slice(Optimizer *o, float *params, const float *grads, double lr_now, int64_t off, int64_t count);
void optim_slices_done(Optimizer *o);
/* The same, skipped on the device when *skip != 0 (a device flag: the GradScaler's found_inf), so
 * the host never waits to learn whether the step happened. `steps` counts attempted steps. That
 * PyTorch creates the momentum buffer at the first step actually taken needs no host knowledge:
 * the buffer starts at zero, and momentum·0 + g = g is what "first" would have stored. Adam keeps
 * the count of steps taken on the device (adam_step_unless). */
void optim_step_unless(Optimizer *o, float *params, const float *grads, double lr_now,
                       const float *skip);

/* --optimizer sgd|adam: optim_init for "sgd"; for "adam", torch.optim.Adam(lr, weight_decay) with
 * its default betas and eps (adam.h; momentum is not used). optim_step and optim_destroy serve both. */
void optim_init_named(Optimizer *o, const char *name, Device *dev, int64_t count, double lr,
                      double momentum, double weight_decay);
/* Adam's step count (its bias corrections' t: the steps it has taken, skipped ones not counted),
 * which a checkpoint keeps; reading it synchronises once the GradScaler's path has kept it on the
 * device. Set it (before training) when resuming. */
int64_t optim_adam_steps(Optimizer *o);
void optim_set_adam_steps(Optimizer *o, int64_t n);

/* The learning rate of optimizer step `step` (the number of steps already taken, so step 0 runs first).
 * schedule "const": lr. "cosine": lr · ½(1 + cos(π · step / total_steps)), annealed to 0 over the run
 * (torch.optim.lr_scheduler.CosineAnnealingLR stepped per iteration). With warmup W > 0 the first W
 * steps ramp linearly from start_factor · lr towards lr — lr · (f + (1 − f) · step / W) — and the
 * schedule then runs over the remaining total_steps − W steps, counted from W: PyTorch's
 * SequentialLR([LinearLR(start_factor=f, total_iters=W), main], milestones=[W]), main being
 * CosineAnnealingLR(T_max = total_steps − W) or nothing for const (torchvision's reference scripts build
 * the same, stepped per epoch). Checked against torch: tests/fixtures/schedule.txt. */
double lr_schedule(const char *schedule, double lr, int64_t warmup, double start_factor, int64_t step,
                   int64_t total_steps);

#endif
