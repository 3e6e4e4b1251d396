/* graph.h — CUDA graphs: capture a stretch of the training step once, replay it every step after.
 *
 * What you will learn: why a fast GPU can sit idle. A ResNet-18 step is ~300 kernels and ~60 cuDNN
 * calls; issuing each costs the host microseconds (argument checks, cuDNN's plan lookup, the
 * launch itself). When the kernels get faster than that — 16-bit tensor cores, channels-last — the
 * GPU waits for the host between kernels: the step is host-bound (docs/results.md measures it). A
 * CUDA graph records the launches once (stream capture) and replays them all with one call, so
 * the host cost of a stretch becomes one launch. PyTorch's torch.cuda.graphs and
 * torch.compile(mode="reduce-overhead") do the same.
 *
 * A graph replays the SAME kernels with the SAME arguments: the addresses it reads and writes must
 * not change between replays. So a graph is kept per key — the batch size, the input buffer's
 * address (the input pipe double-buffers), which stretch of the step — and dropped (graph_clear)
 * whenever the model's memory is laid out again (model_prepare). The first run of a key runs
 * eagerly (the first launch of a kernel may load its module, cuDNN sets kernels up on first use:
 * neither may happen during a capture); the second is captured, then launched; later ones replay.
 * Host work between stretches — DDP's gradient hooks, which launch all-reduces the moment a
 * bucket's last gradient is issued — stays outside the graphs, between launches (model.c).
 *
 * On the CPU backend, or with --no-cuda-graph, graph_run just runs the stretch. */
#ifndef GRAPH_H
#define GRAPH_H

#include "device.h"

typedef struct GraphKey {
    const void *x; /* the input buffer the stretch reads (NULL when it reads none) */
    int n;         /* batch size */
    int part;      /* which stretch: the forward, or backward segment k */
    int fresh;     /* backward: 1 right after zero_grad, whose stretches write the fp32 conv weight
                    * gradients instead of adding them (model.c) — a different graph */
} GraphKey;

typedef struct GraphCache {
    Device *dev;
    int enabled;           /* 0: run every stretch eagerly (CPU, --no-cuda-graph, stage 2) */
    struct GraphEntry *e;  /* one per key seen */
    int count, cap;
    int64_t captures, replays; /* graphs captured; launches of a captured graph */
    const void *workspace, *bn_scratch; /* the device's shared buffers the graphs baked in */
} GraphCache;

void graph_init(GraphCache *c, Device *dev, int enabled);
void graph_destroy(GraphCache *c);
/* Forget every captured graph: the addresses they baked in changed. */
void graph_clear(GraphCache *c);
/* Run body(arg) — which issues work on dev->stream only, and neither allocates nor synchronises —
 * for key: eagerly the first time, captured and launched the second, replayed after. */
void graph_run(GraphCache *c, GraphKey key, void (*body)(void *), void *arg);

#endif
