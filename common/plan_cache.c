/* plan_cache.c — a thread's own convolution plan cache (see plan_cache.h). */
#include "plan_cache.h"

#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "errors.h"
#include "trace.h"

void plan_cache_init(PlanCache *pc, double charge_us) {
    memset(pc, 0, sizeof *pc);
    pc->charge_us = charge_us;
}

void plan_cache_destroy(PlanCache *pc) {
    free(pc->slot);
    pc->slot = NULL;
    pc->count = pc->cap = 0;
}

static PlanSlot *lookup(PlanCache *pc, const Conv *c, int n) {
    for (int i = 0; i < pc->count; i++)
        if (pc->slot[i].conv == c && pc->slot[i].n == n) return &pc->slot[i];
    return NULL;
}

void plan_cache_conv_forward(PlanCache *pc, Device *d, Conv *c, int n, const float *x,
                             const float *w, float *y) {
    PlanSlot *s = lookup(pc, c, n);
    if (s) {
        pc->hits++;
    } else {
        if (pc->count == pc->cap) {
            pc->cap = pc->cap ? 2 * pc->cap : 32;
            pc->slot = xrealloc(pc->slot, (size_t)pc->cap * sizeof *pc->slot);
        }
        s = &pc->slot[pc->count++];
        *s = (PlanSlot){.conv = c, .n = n, .algo = {.algo = -1}};
        TraceSpan span = trace_begin("planning", "planning", n); /* a miss: this thread plans */
        double t0 = time_now();
        conv_forward_plan(d, c, n, &s->algo, x, w, y); /* choose only: the real calls */
        double own = time_now() - t0, until = t0 + 1e-6 * pc->charge_us;
        while (time_now() < until) { /* the rest of the calibrated cost: host time, busy */
        }
        trace_end(span);
        pc->own_s += own;
        /* what the calibration charges, not the spin's wall time: a thread preempted while it spins
         * (an oversubscribed CPU) runs past `until`, and that is the machine's noise, not the model's */
        pc->charged_s += own < 1e-6 * pc->charge_us ? 1e-6 * pc->charge_us - own : 0;
        pc->misses++;
    }
    conv_forward_plan(d, c, n, &s->algo, x, w, y);
}
