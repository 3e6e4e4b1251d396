/* clip.h — gradient clipping by the global norm: torch.nn.utils.clip_grad_norm_(model.parameters(),
 * max_norm), the --clip-grad-norm flag of every stage.
 *
 * What you will learn: where clipping goes in each kind of training loop, and why there.
 *   - It rescales the WHOLE gradient, so it must see the whole gradient: after backward, before the
 *     optimizer step. The total norm ‖g‖₂ over every parameter decides one coefficient,
 *     min(1, max_norm / (‖g‖₂ + 1e-6)), and every gradient is multiplied by it — the direction of
 *     the step is kept, only its length is capped.
 *   - DataParallel (stage 2): after the replicas' gradients are reduced onto GPU0, where the one
 *     optimizer steps.
 *   - DDP (stage 3): after the all-reduce. Every rank then holds the same averaged gradient, so
 *     every rank computes the same norm and the same coefficient on its own, and the replicas stay
 *     identical with no communication of their own. (Clipping each rank's local gradient before the
 *     all-reduce would be a different, rank-dependent clip.) DDP's --optimizer-overlap steps each
 *     bucket before the last gradient exists, so it cannot clip: the two are refused together, as
 *     PyTorch's _register_fused_optim has no place for clip_grad_norm_ either.
 *   - Gradient accumulation (stage 4): once per optimizer step, on the accumulated gradient —
 *     never on a micro-batch's share of it.
 *   - Mixed precision (stage 5): the gradients are multiplied by the GradScaler's scale, so their
 *     norm is too (2^16 times the true one). Clip them only after scaler.unscale_(optimizer), or the
 *     threshold means nothing (PyTorch's AMP recipe, "Working with Unscaled Gradients").
 *
 * Nothing here waits for the GPU: the norm and the coefficient stay in device memory, the clipping
 * is one more kernel, and the host reads the norm only where the report needs it (every --log-every
 * steps, as it reads the loss). clip_grad_norm_ returns the total norm from BEFORE the clipping; so
 * does clip_last_norm, and the step records report it as "grad_norm". */
#ifndef CLIP_H
#define CLIP_H

#include <stdint.h>

#include "device.h"

typedef struct GradClip {
    Device *dev;
    double max_norm; /* 0: clipping is off, and clip_grad_norm does nothing */
    int64_t count;   /* floats in the flat gradient buffer */
    void *state;     /* device, one block: the norm's partial sums, then norm, coef, clipped */
    double *partials;
    float *norm, *coef; /* the last step's total norm (before clipping) and the factor applied */
    int64_t *clipped;   /* optimizer steps whose gradient was scaled down (coef < 1) */
    int64_t steps;      /* clip_grad_norm calls */
} GradClip;

/* max_norm 0 allocates nothing. count: the model's parameter floats (its grad_flat). */
void clip_init(GradClip *c, Device *d, int64_t count, double max_norm);
void clip_destroy(GradClip *c);
/* torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) over grads (count floats), in place,
 * on the device's stream. Nothing when clipping is off. */
void clip_grad_norm(GradClip *c, float *grads);
/* These synchronise (for reports and tests, not for the step): the total norm the last
 * clip_grad_norm measured, and how many steps it has scaled down. */
float clip_last_norm(GradClip *c);
int64_t clip_clipped_steps(GradClip *c);

#endif
