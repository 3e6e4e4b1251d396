/* graph.c — capture once, replay after (see graph.h). */
#include "graph.h"

#include <stdlib.h>
#include <string.h>

#include "trace.h"

typedef struct GraphEntry {
    GraphKey key;
    int seen; /* 0: its first run, eager; then captured once (exec) and replayed */
#ifdef USE_CUDA
    cudaGraphExec_t exec;
#endif
} GraphEntry;

void graph_init(GraphCache *c, Device *dev, int enabled) {
    memset(c, 0, sizeof *c);
    c->dev = dev;
    c->enabled = enabled && dev->kind == DEV_CUDA;
}

void graph_clear(GraphCache *c) {
#ifdef USE_CUDA
    for (int i = 0; i < c->count; i++)
        if (c->e[i].exec) CHECK_CUDA(cudaGraphExecDestroy(c->e[i].exec));
#endif
    c->count = 0;
}

void graph_destroy(GraphCache *c) {
    graph_clear(c);
    free(c->e);
    c->e = NULL, c->cap = 0;
}

#ifdef USE_CUDA /* the CPU backend keeps no graphs */
static GraphEntry *entry(GraphCache *c, GraphKey k) {
    for (int i = 0; i < c->count; i++) {
        GraphEntry *e = &c->e[i];
        if (e->key.x == k.x && e->key.n == k.n && e->key.part == k.part && e->key.fresh == k.fresh) return e;
    }
    if (c->count == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        GraphEntry *grown = xcalloc((size_t)cap, sizeof *grown);
        if (c->count) memcpy(grown, c->e, (size_t)c->count * sizeof *grown);
        free(c->e);
        c->e = grown, c->cap = cap;
    }
    GraphEntry *e = &c->e[c->count++];
    memset(e, 0, sizeof *e);
    e->key = k;
    return e;
}
#endif

void graph_run(GraphCache *c, GraphKey key, void (*body)(void *), void *arg) {
    /* --trace records events around each stretch's ops: those runs stay eager */
    if (!c->enabled || trace_on()) {
        body(arg);
        return;
    }
#ifdef USE_CUDA
    /* the device's shared buffers grow (and move) when a new shape needs more: graphs are stale */
    if (c->workspace != c->dev->workspace || c->bn_scratch != c->dev->bn_scratch) {
        graph_clear(c);
        c->workspace = c->dev->workspace, c->bn_scratch = c->dev->bn_scratch;
    }
    GraphEntry *e = entry(c, key);
    if (!e->seen) { /* first time: eager (module loading and cuDNN's setup happen here) */
        e->seen = 1;
        body(arg);
        return;
    }
    cudaStream_t s = c->dev->stream;
    if (!e->exec) {
        /* Thread-local capture: the loader's threads keep copying on their own stream meanwhile. */
        cudaGraph_t g;
        CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        body(arg);
        cudaError_t err = cudaStreamEndCapture(s, &g);
        if (err != cudaSuccess)
            die_at(__FILE__, __LINE__, "cudaStreamEndCapture", cudaGetErrorString(err),
                   "a step's launches could not be captured into a CUDA graph: run with --no-cuda-graph "
                   "(and please report it)");
        CHECK_CUDA(cudaGraphInstantiate(&e->exec, g, 0));
        CHECK_CUDA(cudaGraphDestroy(g));
        c->captures++;
    } else {
        c->replays++;
    }
    CHECK_CUDA(cudaGraphLaunch(e->exec, s));
#else
    (void)key;
    body(arg);
#endif
}
