/* clip.c — torch.nn.utils.clip_grad_norm_ over the flat gradient buffer (clip.h): the norm and the
 * coefficient on the device (ops.h: clip_norm_coef), then one multiply (scale_by_device), as torch's
 * _foreach_mul_(grads, clip_coef_clamped) — applied even when the coefficient is 1, which changes no
 * bit. */
#include "clip.h"

#include <string.h>

#include "ops.h"
#include "trace.h"

/* The device block: CLIP_PARTS doubles, norm and coef (floats), the clipped-steps counter (int64). */
#define OFF_NORM ((size_t)CLIP_PARTS * sizeof(double))
#define OFF_CLIPPED (OFF_NORM + 2 * sizeof(float))
#define CLIP_BYTES (OFF_CLIPPED + sizeof(int64_t))

void clip_init(GradClip *c, Device *d, int64_t count, double max_norm) {
    memset(c, 0, sizeof *c);
    c->dev = d, c->count = count, c->max_norm = max_norm;
    if (max_norm <= 0) return;
    c->state = device_alloc(d, CLIP_BYTES, "gradient clipping");
    device_memset0(d, c->state, CLIP_BYTES);
    char *base = c->state;
    c->partials = (double *)base;
    c->norm = (float *)(base + OFF_NORM);
    c->coef = c->norm + 1;
    c->clipped = (int64_t *)(base + OFF_CLIPPED);
}

void clip_destroy(GradClip *c) {
    if (c->state) device_free(c->dev, c->state);
    c->state = NULL;
}

void clip_grad_norm(GradClip *c, float *grads) {
    if (c->max_norm <= 0) return;
    TraceDev span = trace_dev_begin(c->dev, TRACE_COMPUTE, NULL, "clip grad norm", "optimizer", -1);
    clip_norm_coef(c->dev, c->count, grads, c->partials, (float)c->max_norm, c->norm, c->coef, c->clipped);
    scale_by_device(c->dev, c->count, grads, c->coef); /* grads ·= min(1, max_norm / (norm + 1e-6)) */
    trace_dev_end(span);
    c->steps++;
}

float clip_last_norm(GradClip *c) {
    float v = 0.0f;
    if (c->state) device_copy_d2h(c->dev, &v, c->norm, sizeof v);
    return v;
}

int64_t clip_clipped_steps(GradClip *c) {
    int64_t v = 0;
    if (c->state) device_copy_d2h(c->dev, &v, c->clipped, sizeof v);
    return v;
}
