/* plan_cache.h — one thread's own cache of convolution forward plans.
 *
 * PyTorch keeps its cuDNN execution plans in thread_local caches ("cuDNN Execution Plans are not
 * guaranteed to be thread safe", aten/src/ATen/native/cudnn/Conv_v8.cpp), so the first
 * convolution of each shape a thread runs is planned again by that thread: cuDNN's heuristics and
 * the building of an execution plan, or with cudnn.benchmark a timed search over every algorithm.
 * nn.DataParallel's parallel_apply starts a new thread per replica every step, so every step every
 * replica plans every forward convolution again (docs/semantics.md). A PlanCache is that cache:
 * the thread that owns it creates it, passes it to each convolution it runs, and throws it away
 * when it ends.
 *
 * A miss plans for real (conv_forward_plan: cuDNN calls made by this thread; nothing on the CPU
 * backend) and then costs at least `charge_us` in all: our legacy-API calls are far cheaper than
 * PyTorch's v8 execution-plan building, so the rest of the calibrated cost is spent on the host
 * (busy, as planning is) — a named charge, measured by tests/torch/calibrate_dp.py as a new
 * thread's first forward minus a warm forward, per convolution. Hits cost nothing. Planning runs
 * inside the C++ convolution call, so no GIL is held. */
#ifndef PLAN_CACHE_H
#define PLAN_CACHE_H

#include <stdint.h>

#include "device.h"
#include "ops.h"

typedef struct PlanSlot {
    const Conv *conv;
    int n;
    ConvFwdAlgo algo;
} PlanSlot;

typedef struct PlanCache {
    double charge_us;  /* the calibrated cost of one plan: a miss takes at least this long */
    PlanSlot *slot;
    int count, cap;
    int64_t hits, misses;
    double own_s;      /* time in our real planning calls (cuDNN's, on this thread) */
    double charged_s;  /* the calibrated time charged on top of them: charge_us per miss, less own */
} PlanCache;

void plan_cache_init(PlanCache *pc, double charge_us); /* empty, as a new thread's */
void plan_cache_destroy(PlanCache *pc);
/* conv_forward through the cache: the plan for (c, n) if this cache has one, else plan it now. */
void plan_cache_conv_forward(PlanCache *pc, Device *d, Conv *c, int n, const float *x,
                             const float *w, float *y);

#endif
