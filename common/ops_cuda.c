/* ops_cuda.c — the CUDA backend of ops.h (see ops_cuda.h).
 *
 * Convolution uses cuDNN's *legacy* API (cudnnConvolutionForward & co.). It is
 * deprecated in cuDNN 9 in favour of the graph API but still shipped, and it is what PyTorch's
 * eager mode calls, so our choices (algorithm search, math type, determinism) mirror PyTorch's.
 * The linear layer is a cuBLAS SGEMM; batch norm and everything else are kernels of ours (kernels.cu).
 * Every op is issued on d->stream (cuDNN's and cuBLAS's handles were bound to it in device_init)
 * and none synchronises with the host. Nothing here allocates device memory except conv planning,
 * which runs at model setup. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#ifdef USE_CUDA

#include "ops_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "kernels.h"
#include "precision.h"
#include "rng.h"

/* ================================================================================================
 * Convolution
 *
 * A Conv's plan holds, for each batch size prepared so far, the cuDNN descriptors and the chosen
 * algorithm (+ its workspace size) of the three passes: forward, backward-data, backward-filter.
 * The filter descriptor does not depend on the batch size, so it is shared.
 *
 * Algorithm choice, as PyTorch does it:
 *  - d->benchmark: measure every algorithm on scratch tensors (cudnnFind*Ex) and take the fastest;
 *  - otherwise:    take cuDNN's heuristic ranking (cudnnGet*_v7), no GPU time spent;
 *  - either way, skip failed entries, non-deterministic ones when d->deterministic, ones needing
 *    more than the workspace cap, and TF32 ones unless d->allow_tf32.
 * Workspace, never a per-layer copy: a Conv whose owner provides it (own_workspace; the model's
 * planned arena gives each convolution a slot alive only during its forward step and one during
 * its backward step, sized from conv_workspace_bytes) uses that; otherwise the device's ONE shared
 * workspace (device_workspace), grown at planning time to the largest chosen algorithm's need.
 * One algorithm may ask for at most 1 GiB, or CUDNN_CONV_WSCAP_DBG MiB from the environment, the
 * variable PyTorch reads for the same limit (it also bounds the benchmark search's workspace).
 * The math type: CUDNN_DEFAULT_MATH lets cuDNN use TF32 tensor cores for fp32 (PyTorch's default,
 * torch.backends.cudnn.allow_tf32 = True); CUDNN_FMA_MATH forces true fp32 arithmetic.
 * ============================================================================================== */

#define CONV_PLAN_MAX_N 16                    /* batch sizes per Conv (train, last, eval, ...) */
#define CONV_WORKSPACE_CAP conv_workspace_cap()
#define CONV_MAX_ALGOS 16                     /* > any CUDNN_CONVOLUTION_*_ALGO_COUNT */

/* The most workspace one algorithm may ask for: CUDNN_CONV_WSCAP_DBG (MiB), else 1 GiB. */
static size_t conv_workspace_cap(void) {
    static size_t cap; /* read once; 0 = not yet */
    if (cap) return cap;
    const char *v = getenv("CUDNN_CONV_WSCAP_DBG");
    size_t c = (size_t)1 << 30;
    if (v && *v) {
        char *end;
        long long mib = strtoll(v, &end, 10);
        if (*end || mib < 0 || mib > (1LL << 24))
            die_user("CUDNN_CONV_WSCAP_DBG=%s: expected the cuDNN workspace cap in MiB, e.g. 256",
                     v);
        c = (size_t)mib << 20;
    }
    cap = c ? c : 1; /* 0 MiB: only algorithms that need no workspace */
    return cap;
}

enum { PASS_FWD = 0, PASS_BWD_DATA = 1, PASS_BWD_FILTER = 2, N_PASSES = 3 };
static const char *const pass_name[N_PASSES] = {"forward", "backward-data", "backward-filter"};
static const int pass_algo_count[N_PASSES] = {CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                              CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT};

typedef struct ConvPlanEntry {
    int n;
    cudnnTensorDescriptor_t x_desc, y_desc; /* [n][cin][h][w], [n][cout][hout][wout]; NHWC when channels-last */
    /* One convolution descriptor per pass, because each carries the math type of the algorithm
     * chosen for that pass (cuDNN needs algorithm + math type to pick its kernel). */
    cudnnConvolutionDescriptor_t conv_desc[N_PASSES];
    int algo[N_PASSES]; /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    size_t ws_bytes[N_PASSES];
} ConvPlanEntry;

typedef struct ConvPlan {
    cudnnFilterDescriptor_t w_desc; /* [cout][cin][k][k]; [cout][k][k][cin] (KRSC) when channels-last */
    int count;
    ConvPlanEntry entry[CONV_PLAN_MAX_N];
} ConvPlan;

/* The three cudnn*AlgoPerf_t structs have the same fields but different types; copy the fields we
 * use into one struct so the selection logic is written once. */
typedef struct Candidate {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
} Candidate;

#define TO_CANDIDATES(out, perf, count)                                                            \
    for (int i_ = 0; i_ < (count); i_++) {                                                         \
        (out)[i_].algo = (int)(perf)[i_].algo;                                                     \
        (out)[i_].status = (perf)[i_].status;                                                      \
        (out)[i_].memory = (perf)[i_].memory;                                                      \
        (out)[i_].determinism = (perf)[i_].determinism;                                            \
        (out)[i_].math = (perf)[i_].mathType;                                                      \
    }

/* Scratch tensors for the benchmark search, so measuring never touches the model's buffers.
 * x doubles as dx, y as dy, w as dw. */
typedef struct Scratch {
    void *x, *y, *w, *ws;
    size_t ws_bytes;
} Scratch;

/* The math type a search starts from. fp16/bf16 data: tensor cores (CUDNN_TENSOR_OP_MATH), as
 * PyTorch sets for half convolutions; the compute type stays FLOAT (fp32 accumulation). */
static cudnnMathType_t base_math(const Device *d, const Conv *c) {
    if (c->prec != PREC_FP32) return CUDNN_TENSOR_OP_MATH;
    return d->allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

/* Channels-last: NHWC activations and KRSC ([cout][k][k][cin]) filters. */
static cudnnTensorFormat_t conv_format(const Conv *c) {
    return c->channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
}

/* cuDNN's name for a tensor element type. */
static cudnnDataType_t cudnn_type(Precision p) {
    return p == PREC_FP16 ? CUDNN_DATA_HALF : p == PREC_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

/* Workspace one algorithm needs for one pass (with the descriptor's current math type); not
 * SUCCESS when the algorithm does not support this configuration. */
static cudnnStatus_t workspace_size(Device *d, const ConvPlan *p, const ConvPlanEntry *e, int pass,
                                    int algo, size_t *bytes) {
    *bytes = 0;
    switch (pass) {
    case PASS_FWD:
        return cudnnGetConvolutionForwardWorkspaceSize(d->cudnn, e->x_desc, p->w_desc,
                                                       e->conv_desc[pass], e->y_desc,
                                                       (cudnnConvolutionFwdAlgo_t)algo, bytes);
    case PASS_BWD_DATA:
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            d->cudnn, p->w_desc, e->y_desc, e->conv_desc[pass], e->x_desc,
            (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    default:
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            d->cudnn, e->x_desc, e->y_desc, e->conv_desc[pass], p->w_desc,
            (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
    }
}

/* cuDNN's ranked list of algorithms for one pass: measured (sc != NULL) or heuristic. */
static int list_candidates(Device *d, const ConvPlan *p, const ConvPlanEntry *e, int pass,
                           const Scratch *sc, Candidate *out) {
    int got = 0;
    cudnnConvolutionDescriptor_t cd = e->conv_desc[pass];
    if (pass == PASS_FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[CONV_MAX_ALGOS];
        if (sc)
            CHECK_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(
                d->cudnn, e->x_desc, sc->x, p->w_desc, sc->w, cd, e->y_desc, sc->y,
                CONV_MAX_ALGOS, &got, perf, sc->ws, sc->ws_bytes));
        else
            CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(d->cudnn, e->x_desc, p->w_desc, cd,
                                                               e->y_desc, CONV_MAX_ALGOS, &got,
                                                               perf));
        TO_CANDIDATES(out, perf, got);
    } else if (pass == PASS_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CONV_MAX_ALGOS];
        if (sc)
            CHECK_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(
                d->cudnn, p->w_desc, sc->w, e->y_desc, sc->y, cd, e->x_desc, sc->x,
                CONV_MAX_ALGOS, &got, perf, sc->ws, sc->ws_bytes));
        else
            CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                d->cudnn, p->w_desc, e->y_desc, cd, e->x_desc, CONV_MAX_ALGOS, &got, perf));
        TO_CANDIDATES(out, perf, got);
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CONV_MAX_ALGOS];
        if (sc)
            CHECK_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(
                d->cudnn, e->x_desc, sc->x, e->y_desc, sc->y, cd, p->w_desc, sc->w,
                CONV_MAX_ALGOS, &got, perf, sc->ws, sc->ws_bytes));
        else
            CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                d->cudnn, e->x_desc, e->y_desc, cd, p->w_desc, CONV_MAX_ALGOS, &got, perf));
        TO_CANDIDATES(out, perf, got);
    }
    return got;
}

/* Pick the first acceptable algorithm of cuDNN's ranking for one pass; leaves the pass's conv
 * descriptor set to that algorithm's math type. */
static void choose_algo(Device *d, const Conv *c, const ConvPlan *p, ConvPlanEntry *e, int pass,
                        const Scratch *sc) {
    Candidate cand[CONV_MAX_ALGOS];
    const int lp = c->prec != PREC_FP32;
    CHECK_CUDNN(cudnnSetConvolutionMathType(e->conv_desc[pass], base_math(d, c)));
    int count = list_candidates(d, p, e, pass, sc, cand);
    for (int i = 0; i < count; i++) {
        const Candidate *k = &cand[i];
        if (k->status != CUDNN_STATUS_SUCCESS) continue;
        if (d->deterministic && k->determinism != CUDNN_DETERMINISTIC) continue;
        /* ALLOW_CONVERSION may down-convert fp32 to half: never for us. Tensor-op math on fp32
         * data means TF32: only when allowed. */
        if (k->math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
        if (!lp && !d->allow_tf32 && k->math == CUDNN_TENSOR_OP_MATH) continue;
        CHECK_CUDNN(cudnnSetConvolutionMathType(
            e->conv_desc[pass], lp || d->allow_tf32 ? k->math : CUDNN_FMA_MATH));
        /* Ask for the workspace again with the final descriptor (this also rejects an algorithm
         * the math type does not support) and keep the larger of the two answers. */
        size_t ws = 0;
        if (workspace_size(d, p, e, pass, k->algo, &ws) != CUDNN_STATUS_SUCCESS) continue;
        if (k->memory > ws) ws = k->memory;
        if (ws > CONV_WORKSPACE_CAP) continue;
        e->algo[pass] = k->algo;
        e->ws_bytes[pass] = ws;
        return;
    }
    char why[256];
    snprintf(why, sizeof why,
             "no usable %s algorithm for conv %d->%d k%d s%d p%d on %dx%d, batch %d "
             "(deterministic=%d, allow_tf32=%d, %d candidates)",
             pass_name[pass], c->s.cin, c->s.cout, c->s.k, c->s.stride, c->s.pad, c->s.h, c->s.w,
             e->n, d->deterministic, d->allow_tf32, count);
    die_at(__FILE__, __LINE__, "choose_algo", why,
           "try without --deterministic, or report the shape and cuDNN version");
}

/* The benchmark search's scratch tensor: n values uniform in [-scale, scale], in the Conv's type.
 * Made on the host (the search runs once per shape, at setup); the copy is done when this returns
 * (a pageable source), so the host buffer can go. */
static void fill_scratch(Device *d, Precision p, void *dst, int64_t n, float scale, uint64_t seed) {
    float *h = xmalloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        h[i] = scale * (float)((double)(hash3(seed, (uint64_t)i, 0) >> 40) * (2.0 / 16777216.0) - 1.0);
    if (p == PREC_FP32) {
        device_copy_h2d(d, dst, h, (size_t)n * sizeof(float));
    } else {
        uint16_t *b = xmalloc((size_t)n * sizeof(uint16_t));
        precision_pack(p, n, h, b);
        device_copy_h2d(d, dst, b, (size_t)n * sizeof(uint16_t));
        free(b);
    }
    free(h);
}

/* Workspace for the benchmark search: the most any algorithm of any pass asks for (up to the cap and
 * to half of what the device has left, --memory-fraction included), so cudnnFind can try them all.
 * It is allocated for the search only and shows in mem_peak, as PyTorch's benchmark workspace shows
 * in max_memory_allocated. */
static size_t search_workspace_bytes(Device *d, const Conv *c, const ConvPlan *p,
                                     ConvPlanEntry *e) {
    size_t most = 0;
    for (int pass = 0; pass < N_PASSES; pass++) {
        CHECK_CUDNN(cudnnSetConvolutionMathType(e->conv_desc[pass], base_math(d, c)));
        for (int algo = 0; algo < pass_algo_count[pass]; algo++) {
            size_t b = 0;
            if (workspace_size(d, p, e, pass, algo, &b) != CUDNN_STATUS_SUCCESS) continue;
            if (b <= CONV_WORKSPACE_CAP && b > most) most = b;
        }
    }
    size_t avail = device_mem_available(d);
    if (most > avail / 2) most = avail / 2;
    return most;
}

static ConvPlanEntry *find_entry(ConvPlan *p, int n) {
    if (!p) return NULL;
    for (int i = 0; i < p->count; i++)
        if (p->entry[i].n == n) return &p->entry[i];
    return NULL;
}

void cuda_conv_prepare(Device *d, Conv *c, int n) {
    const ConvShape *s = &c->s;
    ASSERT(n > 0 && s->hout > 0 && s->wout > 0);
    if (!c->plan) {
        ConvPlan *p = xcalloc(1, sizeof *p);
        CHECK_CUDNN(cudnnCreateFilterDescriptor(&p->w_desc));
        CHECK_CUDNN(cudnnSetFilter4dDescriptor(p->w_desc, cudnn_type(c->prec), conv_format(c),
                                               s->cout, s->cin, s->k, s->k));
        c->plan = p;
    }
    ConvPlan *p = c->plan;
    if (find_entry(p, n)) return;
    if (p->count == CONV_PLAN_MAX_N)
        die_at(__FILE__, __LINE__, "conv_prepare", "too many distinct batch sizes for one Conv",
               "raise CONV_PLAN_MAX_N in ops_cuda.c");

    ConvPlanEntry *e = &p->entry[p->count];
    memset(e, 0, sizeof *e);
    e->n = n;
    CHECK_CUDNN(cudnnCreateTensorDescriptor(&e->x_desc));
    CHECK_CUDNN(cudnnCreateTensorDescriptor(&e->y_desc));
    CHECK_CUDNN(cudnnSetTensor4dDescriptor(e->x_desc, conv_format(c), cudnn_type(c->prec), n,
                                           s->cin, s->h, s->w));
    CHECK_CUDNN(cudnnSetTensor4dDescriptor(e->y_desc, conv_format(c), cudnn_type(c->prec), n,
                                           s->cout, s->hout, s->wout));
    for (int pass = 0; pass < N_PASSES; pass++) {
        CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&e->conv_desc[pass]));
        /* PyTorch's conv is cross-correlation (no kernel flip); dilation 1; fp32 accumulation,
         * also for fp16/bf16 data (PyTorch's "pseudo-half": compute type FLOAT) */
        CHECK_CUDNN(cudnnSetConvolution2dDescriptor(e->conv_desc[pass], s->pad, s->pad, s->stride,
                                                    s->stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                    CUDNN_DATA_FLOAT));
    }
    /* Our shape arithmetic (conv_shape) and cuDNN's must agree. */
    int on, oc, oh, ow;
    CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(e->conv_desc[PASS_FWD], e->x_desc, p->w_desc,
                                                      &on, &oc, &oh, &ow));
    ASSERT(on == n && oc == s->cout && oh == s->hout && ow == s->wout);
    CHECK_CUDNN(cudnnSetStream(d->cudnn, d->stream));

    Scratch sc = {0}, *scp = NULL;
    if (d->benchmark) {
        size_t esz = precision_bytes(d, c->prec);
        size_t xb = (size_t)n * s->cin * s->h * s->w * esz;
        size_t yb = (size_t)n * s->cout * s->hout * s->wout * esz;
        size_t wb = (size_t)s->cout * s->cin * s->k * s->k * esz;
        sc.x = device_alloc(d, xb, "cudnn benchmark scratch (x)");
        sc.y = device_alloc(d, yb, "cudnn benchmark scratch (y)");
        sc.w = device_alloc(d, wb, "cudnn benchmark scratch (w)");
        /* values like a layer's real tensors, which PyTorch benchmarks on: never zeros, which
         * flatter some algorithms (tests/bench_conv_algos.cu), nor garbage NaNs and denormals */
        const int64_t wn = (int64_t)s->cout * s->cin * s->k * s->k;
        fill_scratch(d, c->prec, sc.x, (int64_t)(xb / esz), 1.0f, 1);
        fill_scratch(d, c->prec, sc.y, (int64_t)(yb / esz), 1.0f, 2);
        fill_scratch(d, c->prec, sc.w, wn, 1.0f / sqrtf((float)(wn / s->cout)), 3);
        sc.ws_bytes = search_workspace_bytes(d, c, p, e);
        if (sc.ws_bytes) sc.ws = device_alloc(d, sc.ws_bytes, "cudnn benchmark workspace");
        scp = &sc;
    }
    for (int pass = 0; pass < N_PASSES; pass++) choose_algo(d, c, p, e, pass, scp);
    if (scp) {
        CHECK_CUDA(cudaStreamSynchronize(d->stream));
        device_free(d, sc.ws);
        device_free(d, sc.w);
        device_free(d, sc.y);
        device_free(d, sc.x);
    }
    /* Grow the device's shared workspace now, so the step never allocates — unless the owner
     * provides this conv's workspace (its planned arena slots, sized from conv_workspace_bytes). */
    size_t need = 0;
    for (int pass = 0; pass < N_PASSES; pass++)
        if (e->ws_bytes[pass] > need) need = e->ws_bytes[pass];
    if (need && !c->own_workspace) device_workspace(d, need);
    p->count++; /* the entry is complete: publish it */
}

size_t cuda_conv_workspace_bytes(Device *d, Conv *c, int n, int backward) {
    (void)d;
    const ConvPlanEntry *e = find_entry(c->plan, n);
    if (!e) return 0;
    if (!backward) return e->ws_bytes[PASS_FWD];
    size_t a = e->ws_bytes[PASS_BWD_DATA], b = e->ws_bytes[PASS_BWD_FILTER];
    return a > b ? a : b;
}

void cuda_conv_release(Device *d, Conv *c) {
    ConvPlan *p = c->plan;
    if (!p) return;
    for (int i = 0; i < p->count; i++) {
        ConvPlanEntry *e = &p->entry[i];
        for (int pass = 0; pass < N_PASSES; pass++)
            CHECK_CUDNN(cudnnDestroyConvolutionDescriptor(e->conv_desc[pass]));
        CHECK_CUDNN(cudnnDestroyTensorDescriptor(e->x_desc));
        CHECK_CUDNN(cudnnDestroyTensorDescriptor(e->y_desc));
    }
    CHECK_CUDNN(cudnnDestroyFilterDescriptor(p->w_desc));
    free(p);
    c->plan = NULL;
    /* The workspace belongs to the device (shared by all convs) and stays with it. */
}

/* The plan entry for batch n, prepared on the spot if the caller did not (ops.h allows it). */
static ConvPlanEntry *entry_for(Device *d, Conv *c, int n) {
    ConvPlanEntry *e = find_entry(c->plan, n);
    if (!e) {
        cuda_conv_prepare(d, c, n);
        e = find_entry(c->plan, n);
    }
    return e;
}

/* The conv's own workspace for this pass when its owner provided one large enough, else the
 * device's shared one (already large enough since prepare grew it, so this never allocates). */
static void *workspace_for(Device *d, const Conv *c, int backward, size_t bytes) {
    if (!bytes) return NULL;
    if (c && c->ws[backward] && bytes <= c->ws_cap[backward]) return c->ws[backward];
    return device_workspace(d, bytes);
}

static const float ONE = 1.f, ZERO = 0.f;

void cuda_conv_forward(Device *d, Conv *c, int n, const float *x, const float *w, float *y) {
    ConvPlanEntry *e = entry_for(d, c, n);
    const ConvPlan *p = c->plan;
    size_t ws = e->ws_bytes[PASS_FWD];
    CHECK_CUDNN(cudnnConvolutionForward(d->cudnn, &ONE, e->x_desc, x, p->w_desc, w,
                                        e->conv_desc[PASS_FWD],
                                        (cudnnConvolutionFwdAlgo_t)e->algo[PASS_FWD],
                                        workspace_for(d, c, 0, ws), ws, &ZERO, e->y_desc, y));
}

/* conv_forward with a caller-held algorithm (ops.h: conv_forward_plan). Choosing it reuses the
 * Conv's descriptors but not its algorithm: the heuristic query or, with d->benchmark, the
 * cudnnFindConvolutionForwardAlgorithmEx search runs now, on this thread, on the call's own x, w
 * and y (the forward overwrites y right after), as PyTorch benchmarks on the real tensors.
 * The descriptor's math type is set to the algorithm's for the call and put back afterwards, so
 * the Conv's own plan (used by backward and by conv_forward) is left as it was. */
void cuda_conv_forward_plan(Device *d, Conv *c, int n, ConvFwdAlgo *a, const float *x,
                            const float *w, float *y) {
    ConvPlanEntry *e = entry_for(d, c, n);
    const ConvPlan *p = c->plan;
    cudnnConvolutionDescriptor_t cd = e->conv_desc[PASS_FWD];
    cudnnMathType_t own_math;
    CHECK_CUDNN(cudnnGetConvolutionMathType(cd, &own_math));
    if (a->algo < 0) {
        ConvPlanEntry t = *e; /* the same descriptors; the choice lands in t, not in e */
        Scratch sc = {.x = (void *)x, .y = y, .w = (void *)w}, *scp = NULL;
        if (d->benchmark) { /* the most any forward algorithm asks for, as search_workspace_bytes */
            CHECK_CUDNN(cudnnSetConvolutionMathType(cd, base_math(d, c)));
            for (int algo = 0; algo < pass_algo_count[PASS_FWD]; algo++) {
                size_t b = 0;
                if (workspace_size(d, p, &t, PASS_FWD, algo, &b) != CUDNN_STATUS_SUCCESS) continue;
                if (b <= CONV_WORKSPACE_CAP && b > sc.ws_bytes) sc.ws_bytes = b;
            }
            size_t avail = device_mem_available(d);
            if (sc.ws_bytes > avail / 2) sc.ws_bytes = avail / 2;
            if (sc.ws_bytes) sc.ws = device_alloc(d, sc.ws_bytes, "cudnn benchmark workspace");
            scp = &sc;
        }
        choose_algo(d, c, p, &t, PASS_FWD, scp);
        if (scp) {
            CHECK_CUDA(cudaStreamSynchronize(d->stream));
            device_free(d, sc.ws);
        }
        cudnnMathType_t m;
        CHECK_CUDNN(cudnnGetConvolutionMathType(cd, &m));
        *a = (ConvFwdAlgo){.algo = t.algo[PASS_FWD], .math = (int)m, .ws_bytes = t.ws_bytes[PASS_FWD]};
        if (a->ws_bytes) device_workspace(d, a->ws_bytes); /* grows it if the search chose a bigger one */
        CHECK_CUDNN(cudnnSetConvolutionMathType(cd, own_math));
        return;
    }
    CHECK_CUDNN(cudnnSetConvolutionMathType(cd, (cudnnMathType_t)a->math));
    CHECK_CUDNN(cudnnConvolutionForward(d->cudnn, &ONE, e->x_desc, x, p->w_desc, w, cd,
                                        (cudnnConvolutionFwdAlgo_t)a->algo,
                                        workspace_for(d, NULL, 0, a->ws_bytes), a->ws_bytes, &ZERO,
                                        e->y_desc, y));
    CHECK_CUDNN(cudnnSetConvolutionMathType(cd, own_math));
}

void cuda_conv_backward_data(Device *d, Conv *c, int n, const float *dy, const float *w, float *dx,
                             int accumulate) {
    ConvPlanEntry *e = entry_for(d, c, n);
    const ConvPlan *p = c->plan;
    size_t ws = e->ws_bytes[PASS_BWD_DATA];
    /* beta = 1 makes cuDNN add into dx: dx = conv_bwd(dy) + 1·dx */
    CHECK_CUDNN(cudnnConvolutionBackwardData(d->cudnn, &ONE, p->w_desc, w, e->y_desc, dy,
                                             e->conv_desc[PASS_BWD_DATA],
                                             (cudnnConvolutionBwdDataAlgo_t)e->algo[PASS_BWD_DATA],
                                             workspace_for(d, c, 1, ws), ws,
                                             accumulate ? &ONE : &ZERO, e->x_desc, dx));
}

void cuda_conv_backward_filter(Device *d, Conv *c, int n, const float *x, const float *dy,
                               float *dw, int accumulate) {
    ConvPlanEntry *e = entry_for(d, c, n);
    const ConvPlan *p = c->plan;
    size_t ws = e->ws_bytes[PASS_BWD_FILTER];
    /* beta = 1 adds into .grad (ops.h), beta = 0 writes: same algorithm and workspace either way */
    CHECK_CUDNN(cudnnConvolutionBackwardFilter(
        d->cudnn, &ONE, e->x_desc, x, e->y_desc, dy, e->conv_desc[PASS_BWD_FILTER],
        (cudnnConvolutionBwdFilterAlgo_t)e->algo[PASS_BWD_FILTER], workspace_for(d, c, 1, ws), ws,
        accumulate ? &ONE : &ZERO, p->w_desc, dw));
}

/* fp16/bf16: the weight gradient of the cast weight is a fresh 16-bit tensor (beta = 0); the model
 * adds it into the fp32 gradient (cast_add_clear). */
void cuda_conv_backward_filter_lp(Device *d, Conv *c, int n, const void *x, const void *dy,
                                  void *dw) {
    ConvPlanEntry *e = entry_for(d, c, n);
    const ConvPlan *p = c->plan;
    size_t ws = e->ws_bytes[PASS_BWD_FILTER];
    CHECK_CUDNN(cudnnConvolutionBackwardFilter(
        d->cudnn, &ONE, e->x_desc, x, e->y_desc, dy, e->conv_desc[PASS_BWD_FILTER],
        (cudnnConvolutionBwdFilterAlgo_t)e->algo[PASS_BWD_FILTER], workspace_for(d, c, 1, ws), ws,
        &ZERO, p->w_desc, dw));
}

/* ================================================================================================
 * Batch norm: our kernels (kernels.cu), for fp32 as for fp16/bf16, NCHW as NHWC
 * cuDNN's legacy batch norm would do the same arithmetic, but its NCHW kernels give one block to a
 * channel: measured on an H200 (tests/kernel_breakdown.sh stage1), 1.8 of the 7.4 ms of kernel
 * time per ResNet-18 step went to them. Ours cut every channel's n·hw values into chunks (kernels.cu
 * says how) and keep cuDNN's conventions: the running variance takes the unbiased batch variance,
 * save_invstd = 1/sqrt(var_biased + eps), running = (1 − momentum)·running + momentum·batch.
 * ============================================================================================== */

void cuda_bn_prepare(Device *d, int nhwc, int n, int c, int hw) {
    size_t need = launch_bn_scratch_floats(nhwc, n, c, hw) * sizeof(float);
    if (need <= d->bn_scratch_bytes) return;
    if (d->bn_scratch) {
        CHECK_CUDA(cudaStreamSynchronize(d->stream));
        device_free(d, d->bn_scratch);
    }
    d->bn_scratch = device_alloc(d, need, "batch norm scratch");
    d->bn_scratch_bytes = need;
}

/* The scratch for one call: bn_prepare grew it at setup (the step never allocates). */
static float *bn_scratch(Device *d, int nhwc, int n, int c, int hw) {
    /* the kernels' 32-bit indexing: a grid-stride index (stride up to 2^21) must not wrap past 2^32,
     * so at most 2^31 − 1 values, the bound model_create enforces on every activation */
    ASSERT((int64_t)n * c * hw <= INT32_MAX);
    if (launch_bn_scratch_floats(nhwc, n, c, hw) * sizeof(float) > d->bn_scratch_bytes)
        die_at(__FILE__, __LINE__, "bn_scratch", "batch norm ran on a shape bn_prepare never saw",
               "call bn_prepare (model_prepare does) for every batch size before the step");
    return (float *)d->bn_scratch;
}

/* SyncBatchNorm's exchange as the launchers take it (kernels.h), or NULL (a plain batch norm). */
static const BnExchange *bn_exchange(BnExchange *x, const BnSync *s) {
    if (!s) return NULL;
    *x = (BnExchange){.sum = s->sum, .ctx = s->ctx, .rank = s->rank, .world = s->world, .buf = s->buf};
    return x;
}

void cuda_bn_forward_train(Device *d, int n, int c, int hw, const float *x, const float *gamma,
                           const float *beta, float *running_mean, float *running_var,
                           float momentum, float eps, float *save_mean, float *save_invstd,
                           float *y) {
    cuda_bn_forward_train_lp(d, PREC_FP32, 0, n, c, hw, x, gamma, beta, running_mean, running_var,
                             momentum, eps, save_mean, save_invstd, y, 0, NULL);
}

void cuda_bn_forward_eval(Device *d, int n, int c, int hw, const float *x, const float *gamma,
                          const float *beta, const float *running_mean, const float *running_var,
                          float eps, float *y) {
    cuda_bn_forward_eval_lp(d, PREC_FP32, 0, n, c, hw, x, gamma, beta, running_mean, running_var,
                            eps, y);
}

void cuda_bn_backward(Device *d, int n, int c, int hw, const float *x, const float *dy,
                      const float *gamma, const float *save_mean, const float *save_invstd,
                      float eps, float *dx, float *dgamma, float *dbeta, int accumulate) {
    cuda_bn_backward_lp(d, PREC_FP32, 0, n, c, hw, x, NULL, dy, gamma, save_mean, save_invstd, eps,
                        dx, dgamma, dbeta, accumulate, 0, NULL);
}

/* ================================================================================================
 * Elementwise, pooling, loss, optimizer: our kernels
 * ============================================================================================== */

void cuda_relu_forward(Device *d, int64_t count, const float *x, float *y) {
    launch_relu_forward(d->stream, count, x, y);
    CHECK_LAUNCH();
}

void cuda_relu_backward(Device *d, int64_t count, const float *y, const float *dy, float *dx,
                        int accumulate) {
    launch_relu_backward(d->stream, count, y, dy, dx, accumulate);
    CHECK_LAUNCH();
}

void cuda_add_forward(Device *d, int64_t count, const float *a, const float *b, float *y) {
    launch_add_forward(d->stream, count, a, b, y);
    CHECK_LAUNCH();
}

void cuda_grad_pass(Device *d, int64_t count, const float *src, float *dst, int accumulate) {
    launch_grad_pass(d->stream, count, src, dst, accumulate);
    CHECK_LAUNCH();
}

void cuda_avgpool_forward(Device *d, int n, int c, int hw, const float *x, float *y) {
    launch_avgpool_forward(d->stream, n, c, hw, x, y);
    CHECK_LAUNCH();
}

void cuda_avgpool_backward(Device *d, int n, int c, int hw, const float *dy, float *dx,
                           int accumulate) {
    launch_avgpool_backward(d->stream, n, c, hw, dy, dx, accumulate);
    CHECK_LAUNCH();
}

void cuda_xent_forward_backward(Device *d, int n, int classes, const float *logits,
                                const int32_t *labels, float scale, float *loss, int32_t *correct,
                                float *dlogits) {
    ASSERT(n >= 0 && classes > 0);
    launch_xent_forward_backward(d->stream, n, classes, logits, labels, scale, loss, correct,
                                 dlogits);
    CHECK_LAUNCH();
}

void cuda_sgd_step(Device *d, int64_t count, float *params, const float *grads,
                   float *momentum_buf, float lr, float momentum, float weight_decay, int first) {
    launch_sgd_step(d->stream, count, params, grads, momentum_buf, lr, momentum, weight_decay,
                    first);
    CHECK_LAUNCH();
}

void cuda_scale_inplace(Device *d, int64_t count, float *x, float alpha) {
    launch_scale_inplace(d->stream, count, x, alpha);
    CHECK_LAUNCH();
}

void cuda_add_inplace(Device *d, int64_t count, const float *x, float *y) {
    launch_add_inplace(d->stream, count, x, y);
    CHECK_LAUNCH();
}

/* ================================================================================================
 * Linear: cuBLAS SGEMM in plain fp32 (the handle's math mode is CUBLAS_DEFAULT_MATH: no TF32,
 * as PyTorch's default matmul). cuBLAS is column-major; a row-major [r][c] matrix is, to cuBLAS,
 * its transpose [c][r] with leading dimension c. So every product below is written for the
 * transposes:  y = x·Wᵀ  ⇔  yᵀ = W·xᵀ, and so on.
 * ============================================================================================== */

void cuda_linear_forward(Device *d, int n, int in, int out, const float *x, const float *W,
                         const float *b, float *y) {
    if (n <= 0) return;
    /* yᵀ[out][n] = W[out][in] · xᵀ[in][n]; cuBLAS sees W as Wᵀ (in×out, ld in), so op T. */
    CHECK_CUBLAS(cublasSgemm(d->cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &ONE, W, in, x, in,
                             &ZERO, y, out));
    if (b) {
        launch_bias_add(d->stream, n, out, b, y);
        CHECK_LAUNCH();
    }
}

void cuda_linear_backward(Device *d, int n, int in, int out, const float *x, const float *W,
                          const float *dy, float *dx, float *dW, float *db, int accumulate) {
    if (n <= 0) return;
    if (dx) /* dxᵀ[in][n] = Wᵀ[in][out] · dyᵀ[out][n] */
        CHECK_CUBLAS(cublasSgemm(d->cublas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &ONE, W, in, dy,
                                 out, accumulate ? &ONE : &ZERO, dx, in));
    if (dW) /* dWᵀ[in][out] += xᵀ[in][n] · dy[n][out] */
        CHECK_CUBLAS(cublasSgemm(d->cublas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &ONE, x, in, dy,
                                 out, &ONE, dW, in));
    if (db) { /* db[out] += column sums of dy: a kernel, as a GEMV would need a ones vector */
        launch_bias_grad(d->stream, n, out, dy, db);
        CHECK_LAUNCH();
    }
}

/* ================================================================================================
 * Mixed precision (fp16 / bf16 tensors; see ops.h). Convolution is the functions above: the plan's
 * descriptors carry the element type (Conv.prec). Batch norm is our kernels for fp16 and bf16 as for
 * fp32 (fp32 statistics and parameters; the batch norm section above says why not cuDNN's). The
 * linear layer is cublasGemmEx: 16-bit A, B and C with CUBLAS_COMPUTE_32F (tensor cores, fp32
 * accumulation, C rounded once).
 * ============================================================================================== */

static cudaDataType_t cublas_type(Precision p) {
    return p == PREC_FP16 ? CUDA_R_16F : p == PREC_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

void cuda_cast_to(Device *d, Precision p, int64_t count, const float *src, void *dst) {
    launch_cast_to(d->stream, (int)p, count, src, dst);
    CHECK_LAUNCH();
}

void cuda_cast_from(Device *d, Precision p, int64_t count, const void *src, float *dst) {
    launch_cast_from(d->stream, (int)p, count, src, dst);
    CHECK_LAUNCH();
}

void cuda_cast_add_clear(Device *d, Precision p, int64_t count, void *src, float *dst) {
    launch_cast_add_clear(d->stream, (int)p, count, src, dst);
    CHECK_LAUNCH();
}

void cuda_cast_to_nhwc(Device *d, Precision p, int n, int c, int hw, const float *src, void *dst) {
    launch_cast_to_nhwc(d->stream, (int)p, n, c, hw, src, dst);
    CHECK_LAUNCH();
}

void cuda_bn_forward_train_lp(Device *d, Precision p, int nhwc, int n, int c, int hw, const void *x,
                              const float *gamma, const float *beta, float *running_mean,
                              float *running_var, float momentum, float eps, float *save_mean,
                              float *save_invstd, void *y, int relu, const BnSync *sync) {
    ASSERT((int64_t)n * hw > 1); /* the unbiased variance divides by n·hw − 1 */
    BnExchange xch;
    launch_bn_forward_train_lp(d->stream, (int)p, nhwc, n, c, hw, x, gamma, beta, running_mean,
                               running_var, momentum, eps, save_mean, save_invstd, y, relu,
                               bn_scratch(d, nhwc, n, c, hw), bn_exchange(&xch, sync));
    CHECK_LAUNCH();
}

void cuda_bn_forward_eval_lp(Device *d, Precision p, int nhwc, int n, int c, int hw, const void *x,
                             const float *gamma, const float *beta, const float *running_mean,
                             const float *running_var, float eps, void *y) {
    launch_bn_forward_eval_lp(d->stream, (int)p, nhwc, n, c, hw, x, gamma, beta, running_mean,
                              running_var, eps, y);
    CHECK_LAUNCH();
}

void cuda_bn_backward_lp(Device *d, Precision p, int nhwc, int n, int c, int hw, const void *x,
                         const void *y, const void *dy, const float *gamma, const float *save_mean,
                         const float *save_invstd, float eps, void *dx, float *dgamma,
                         float *dbeta, int accumulate, int relu, const BnSync *sync) {
    (void)eps; /* already inside save_invstd */
    ASSERT(!relu || y);
    BnExchange xch;
    launch_bn_backward_lp(d->stream, (int)p, nhwc, n, c, hw, x, y, dy, gamma, save_mean, save_invstd,
                          dx, dgamma, dbeta, accumulate, relu, bn_scratch(d, nhwc, n, c, hw),
                          bn_exchange(&xch, sync));
    CHECK_LAUNCH();
}

void cuda_relu_forward_lp(Device *d, Precision p, int64_t count, const void *x, void *y) {
    launch_relu_forward_lp(d->stream, (int)p, count, x, y);
    CHECK_LAUNCH();
}

void cuda_relu_backward_lp(Device *d, Precision p, int64_t count, const void *y, const void *dy,
                           void *dx, int accumulate) {
    launch_relu_backward_lp(d->stream, (int)p, count, y, dy, dx, accumulate);
    CHECK_LAUNCH();
}

void cuda_add_forward_lp(Device *d, Precision p, int64_t count, const void *a, const void *b,
                         void *y) {
    launch_add_forward_lp(d->stream, (int)p, count, a, b, y);
    CHECK_LAUNCH();
}

void cuda_add_relu_forward_lp(Device *d, Precision p, int64_t count, const void *a, const void *b,
                              void *y) {
    launch_add_relu_forward(d->stream, (int)p, count, a, b, y);
    CHECK_LAUNCH();
}

void cuda_add_relu_backward_lp(Device *d, Precision p, int64_t count, const void *y, const void *dy,
                               void *da, int acc_a, void *db, int acc_b) {
    launch_add_relu_backward(d->stream, (int)p, count, y, dy, da, acc_a, db, acc_b);
    CHECK_LAUNCH();
}

void cuda_grad_pass_lp(Device *d, Precision p, int64_t count, const void *src, void *dst,
                       int accumulate) {
    launch_grad_pass_lp(d->stream, (int)p, count, src, dst, accumulate);
    CHECK_LAUNCH();
}

void cuda_avgpool_forward_lp(Device *d, Precision p, int nhwc, int n, int c, int hw, const void *x,
                             void *y) {
    launch_avgpool_forward_lp(d->stream, (int)p, nhwc, n, c, hw, x, y);
    CHECK_LAUNCH();
}

void cuda_avgpool_backward_lp(Device *d, Precision p, int nhwc, int n, int c, int hw,
                              const void *dy, void *dx, int accumulate) {
    launch_avgpool_backward_lp(d->stream, (int)p, nhwc, n, c, hw, dy, dx, accumulate);
    CHECK_LAUNCH();
}

void cuda_linear_forward_lp(Device *d, Precision p, int n, int in, int out, const void *x,
                            const void *W, const void *b, void *y) {
    if (n <= 0) return;
    cudaDataType_t t = cublas_type(p);
    if (b) { /* y = b, then y = x·Wᵀ + 1·y in fp32 and one rounding, as PyTorch's addmm */
        launch_bias_fill_lp(d->stream, (int)p, n, out, b, y);
        CHECK_LAUNCH();
    }
    CHECK_CUBLAS(cublasGemmEx(d->cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &ONE, W, t, in, x, t,
                              in, b ? &ONE : &ZERO, y, t, out, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

void cuda_linear_backward_lp(Device *d, Precision p, int n, int in, int out, const void *x,
                             const void *W, const void *dy, void *dx, void *dW, void *db,
                             int accumulate) {
    if (n <= 0) return;
    cudaDataType_t t = cublas_type(p);
    if (dx) /* dxᵀ[in][n] = Wᵀ[in][out] · dyᵀ[out][n] (+ dx) */
        CHECK_CUBLAS(cublasGemmEx(d->cublas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &ONE, W, t, in,
                                  dy, t, out, accumulate ? &ONE : &ZERO, dx, t, in,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    /* dWᵀ[in][out] = xᵀ[in][n] · dy[n][out]: a fresh 16-bit gradient (beta 0) */
    CHECK_CUBLAS(cublasGemmEx(d->cublas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &ONE, x, t, in, dy, t,
                              out, &ZERO, dW, t, in, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (db) {
        launch_bias_grad_lp(d->stream, (int)p, n, out, dy, db);
        CHECK_LAUNCH();
    }
}

/* ---- GradScaler --------------------------------------------------------------------------------- */

void cuda_scale_by_device(Device *d, int64_t count, float *x, const float *alpha) {
    launch_scale_by_device(d->stream, count, x, alpha);
    CHECK_LAUNCH();
}

void cuda_amp_unscale_check(Device *d, int64_t count, float *grads, const float *inv_scale,
                            float *found_inf) {
    launch_amp_unscale_check(d->stream, count, grads, inv_scale, found_inf);
    CHECK_LAUNCH();
}

void cuda_amp_update_scale(Device *d, float *scale, float *inv_scale, int32_t *growth_tracker,
                           float *found_inf, int64_t *skipped, double growth_factor,
                           double backoff_factor, int growth_interval) {
    launch_amp_update_scale(d->stream, scale, inv_scale, growth_tracker, found_inf, skipped,
                            growth_factor, backoff_factor, growth_interval);
    CHECK_LAUNCH();
}

void cuda_sgd_step_unless(Device *d, int64_t count, float *params, const float *grads,
                          float *momentum_buf, float lr, float momentum, float weight_decay,
                          int first, const float *skip) {
    launch_sgd_step_unless(d->stream, count, params, grads, momentum_buf, lr, momentum,
                           weight_decay, first, skip);
    CHECK_LAUNCH();
}

void cuda_clip_norm_coef(Device *d, int64_t count, const float *g, double *partials, float max_norm,
                         float *norm, float *coef, int64_t *clipped) {
    launch_clip_norm_coef(d->stream, count, g, partials, CLIP_PARTS, max_norm, norm, coef, clipped);
    CHECK_LAUNCH();
}

void cuda_count_zero_nonfinite(Device *d, int64_t count, const float *x, int64_t *counts) {
    launch_count_zero_nonfinite(d->stream, count, x, counts);
    CHECK_LAUNCH();
}

#endif /* USE_CUDA */
