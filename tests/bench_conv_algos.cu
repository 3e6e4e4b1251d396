/* bench_conv_algos.cu — what `--cudnn-benchmark` (torch.backends.cudnn.benchmark) measures, and why
 * its choice can lose to cuDNN's heuristic: `make bench-conv-algos`.
 *
 *     make bench-conv-algos                      fp32 (TF32) channels-last: stage 1's convolutions
 *     make bench-conv-algos CONV_ARGS="fp16"     fp16 channels-last: stage 5's
 *     build/cuda/tests/bench_conv_algos fp32 nchw
 *
 * What you will learn:
 *  - A convolution pass (forward, backward-data, backward-filter) has several algorithms. cuDNN offers
 *    two ways to choose one: a heuristic ranking (cudnnGet*Algorithm_v7: no GPU time, the default of
 *    our stages and of PyTorch) and a measured one (cudnnFind*AlgorithmEx: every algorithm run on the
 *    GPU, fastest first — what cudnn.benchmark = True does once per shape).
 *  - "Measured" is not "best in training". Find times each algorithm alone, about once, on the
 *    buffers it is given. On zeros some algorithms look far faster than on data (fp16 conv1's
 *    backward-filter algorithm 0: timed at 0.13 ms on zeros, 0.68 ms on data, on an H200): our
 *    search used zero-filled scratch and chose it, so `--cudnn-benchmark` made stage 5 twice as
 *    slow, until the scratch got random values (PyTorch searches on the layer's real tensors). And
 *    the first search of a shape is cold: the times it reports are 1.5–4× the steady-state ones,
 *    so algorithms within a few percent of each other are ranked by noise.
 *  - This harness times each pick the way a training step runs it — on random data, many launches
 *    back to back — and sums the picks over ResNet-18's layers, so the difference per step is a
 *    number, not a guess (docs/results.md, "Why --cudnn-benchmark lost"). It is still a kernel
 *    alone: in bf16 it times one shortcut convolution's heuristic pick at 274 µs against Find's
 *    36 µs, yet stage 5 --amp bf16 runs as fast with either choice. The step has the last word.
 *
 * Every row: one convolution shape of ResNet-18 (CIFAR layout, batch 128) and one pass; how many
 * times a step runs it; then four picks, each with its time measured here on random data
 * (microseconds, the mean of BENCH_REPEAT launches, default 50, back to back after 5 warm-up
 * launches, the GPU's clocks already up): the heuristic's; Find's first search of the shape, on
 * random data as our stages search now ("zeros-first": on zeros, as they searched before); Find's
 * second search on the same tensors; Find on the other set. In brackets, the time Find reported.
 * The totals multiply each row by its count. The acceptable algorithms are the stages' (common/
 * ops_cuda.c choose_algo): status SUCCESS, no ALLOW_CONVERSION math (it may down-convert fp32 to
 * fp16), at most 1 GiB of workspace. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include <cublas_v2.h> /* device.h's, included here first: outside extern "C" */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

/* The project's headers are C; C11's _Noreturn is C++'s [[noreturn]]. device.h's CHECK_CUDA /
 * CHECK_CUDNN stop with file:line, the failed call, cuDNN's or CUDA's reason and a hint. */
#define _Noreturn [[noreturn]]
extern "C" {
#include "device.h"
}
#undef _Noreturn

enum { FWD, BWD_DATA, BWD_FILTER, PASSES };
static const char *PASS[PASSES] = {"fwd", "dgrad", "wgrad"};
static const size_t WS_CAP = (size_t)1 << 30;

/* ResNet-18, CIFAR layout (common/model.c): the distinct convolution shapes and how many of each a
 * step runs. The first convolution reads the image: no backward-data pass. */
struct Shape {
    const char *name;
    int cin, cout, k, stride, pad, hw, count, dgrad;
};
static const Shape SHAPES[] = {
    {"conv1  3→64 k3 32²", 3, 64, 3, 1, 1, 32, 1, 0},
    {"layer1 64→64 k3 32²", 64, 64, 3, 1, 1, 32, 4, 1},
    {"layer2 64→128 k3 s2", 64, 128, 3, 2, 1, 32, 1, 1},
    {"layer2 128→128 k3 16²", 128, 128, 3, 1, 1, 16, 3, 1},
    {"layer2 shortcut k1 s2", 64, 128, 1, 2, 0, 32, 1, 1},
    {"layer3 128→256 k3 s2", 128, 256, 3, 2, 1, 16, 1, 1},
    {"layer3 256→256 k3 8²", 256, 256, 3, 1, 1, 8, 3, 1},
    {"layer3 shortcut k1 s2", 128, 256, 1, 2, 0, 16, 1, 1},
    {"layer4 256→512 k3 s2", 256, 512, 3, 2, 1, 8, 1, 1},
    {"layer4 512→512 k3 4²", 512, 512, 3, 1, 1, 4, 3, 1},
    {"layer4 shortcut k1 s2", 256, 512, 1, 2, 0, 8, 1, 1},
};

struct Pick {
    int algo = -1;
    cudnnMathType_t math = CUDNN_DEFAULT_MATH;
    size_t ws = 0;
    float reported_ms = NAN; /* what Find said (NaN for the heuristic) */
};

struct Conv {
    cudnnHandle_t h;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t c;
    cudnnMathType_t base;
    void *dx, *dw, *dy;        /* the pass's tensors, random data */
    void *zx, *zw, *zy;        /* the same sizes, zeros: what our search measures on */
    void *ws;
    size_t ws_bytes;
};

static size_t workspace(Conv &v, int pass, int algo) {
    size_t b = 0;
    cudnnStatus_t s =
        pass == FWD ? cudnnGetConvolutionForwardWorkspaceSize(v.h, v.x, v.w, v.c, v.y, (cudnnConvolutionFwdAlgo_t)algo, &b)
        : pass == BWD_DATA
            ? cudnnGetConvolutionBackwardDataWorkspaceSize(v.h, v.w, v.y, v.c, v.x, (cudnnConvolutionBwdDataAlgo_t)algo, &b)
            : cudnnGetConvolutionBackwardFilterWorkspaceSize(v.h, v.x, v.y, v.c, v.w,
                                                             (cudnnConvolutionBwdFilterAlgo_t)algo, &b);
    return s == CUDNN_STATUS_SUCCESS ? b : SIZE_MAX;
}

/* The first acceptable entry of a ranking (heuristic or measured), as choose_algo takes it. */
template <typename Perf> static Pick first_acceptable(Conv &v, int pass, const Perf *perf, int got, int measured) {
    for (int i = 0; i < got; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
            continue;
        CHECK_CUDNN(cudnnSetConvolutionMathType(v.c, perf[i].mathType));
        size_t ws = std::max(workspace(v, pass, (int)perf[i].algo), perf[i].memory);
        if (ws > WS_CAP) continue;
        Pick p;
        p.algo = (int)perf[i].algo, p.math = perf[i].mathType, p.ws = ws;
        if (measured) p.reported_ms = perf[i].time;
        return p;
    }
    fprintf(stderr, "no acceptable %s algorithm\n", PASS[pass]);
    exit(1);
}

/* cuDNN's pick for one pass: the heuristic's (how < 0), or Find's on zeros (0) or on random data (1). */
static Pick choose(Conv &v, int pass, int how) {
    const int MAX = 16;
    int got = 0;
    CHECK_CUDNN(cudnnSetConvolutionMathType(v.c, v.base));
    void *x = how == 0 ? v.zx : v.dx, *w = how == 0 ? v.zw : v.dw, *y = how == 0 ? v.zy : v.dy;
    /* Find writes the pass's output into the zero set (never an input of the same pass) */
    if (pass == FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[MAX];
        if (how < 0) CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(v.h, v.x, v.w, v.c, v.y, MAX, &got, perf));
        else CHECK_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(v.h, v.x, x, v.w, w, v.c, v.y, v.zy, MAX, &got, perf,
                                                              v.ws, v.ws_bytes));
        return first_acceptable(v, pass, perf, got, how >= 0);
    }
    if (pass == BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[MAX];
        if (how < 0) CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(v.h, v.w, v.y, v.c, v.x, MAX, &got, perf));
        else CHECK_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(v.h, v.w, w, v.y, y, v.c, v.x, v.zx, MAX, &got,
                                                                   perf, v.ws, v.ws_bytes));
        return first_acceptable(v, pass, perf, got, how >= 0);
    }
    cudnnConvolutionBwdFilterAlgoPerf_t perf[MAX];
    if (how < 0) CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(v.h, v.x, v.y, v.c, v.w, MAX, &got, perf));
    else CHECK_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(v.h, v.x, x, v.y, y, v.c, v.w, v.zw, MAX, &got,
                                                                 perf, v.ws, v.ws_bytes));
    return first_acceptable(v, pass, perf, got, how >= 0);
}

/* One launch of a pass with a pick, reading the random (data = 1) or the zero tensors. The outputs
 * go to the other set's buffer of the same size, so inputs stay what they are. */
static void run(Conv &v, int pass, const Pick &p, int data) {
    const float one = 1.0f, zero = 0.0f;
    void *x = data ? v.dx : v.zx, *w = data ? v.dw : v.zw, *y = data ? v.dy : v.zy;
    void *ox = data ? v.zx : v.dx, *ow = data ? v.zw : v.dw, *oy = data ? v.zy : v.dy;
    CHECK_CUDNN(cudnnSetConvolutionMathType(v.c, p.math));
    if (pass == FWD)
        CHECK_CUDNN(cudnnConvolutionForward(v.h, &one, v.x, x, v.w, w, v.c, (cudnnConvolutionFwdAlgo_t)p.algo, v.ws,
                                          p.ws, &zero, v.y, oy));
    else if (pass == BWD_DATA)
        CHECK_CUDNN(cudnnConvolutionBackwardData(v.h, &one, v.w, w, v.y, y, v.c, (cudnnConvolutionBwdDataAlgo_t)p.algo,
                                               v.ws, p.ws, &zero, v.x, ox));
    else
        CHECK_CUDNN(cudnnConvolutionBackwardFilter(v.h, &one, v.x, x, v.y, y, v.c,
                                                 (cudnnConvolutionBwdFilterAlgo_t)p.algo, v.ws, p.ws, &zero, v.w, ow));
}

/* Microseconds per launch: warm-up, then `repeat` launches back to back between two events. */
static double time_us(Conv &v, int pass, const Pick &p, int data, int repeat, cudaStream_t s) {
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    for (int i = 0; i < 5; i++) run(v, pass, p, data);
    CHECK_CUDA(cudaEventRecord(a, s));
    for (int i = 0; i < repeat; i++) run(v, pass, p, data);
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    CHECK_CUDA(cudaEventDestroy(a));
    CHECK_CUDA(cudaEventDestroy(b));
    return 1e3 * ms / repeat;
}

/* Busy work until the GPU has left its idle clocks, so the first rows are timed like the last. */
__global__ void spin_kernel(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}
static void warm_up(cudaStream_t s, int sms) {
    for (int i = 0; i < 200; i++) spin_kernel<<<sms, 32, 0, s>>>(1000000); /* ~0.5 ms each at ~2 GHz */
    CHECK_CUDA(cudaStreamSynchronize(s));
}

/* The zero set: what our benchmark search measures on (common/ops_cuda.c). */
static void zero(Conv &v, size_t nx, size_t ny, size_t nw, size_t esz) {
    CHECK_CUDA(cudaMemset(v.zx, 0, nx * esz));
    CHECK_CUDA(cudaMemset(v.zy, 0, ny * esz));
    CHECK_CUDA(cudaMemset(v.zw, 0, nw * esz));
}

/* Fill a device buffer of `count` elements of `type` with uniform values in [-scale, scale]. */
static void fill_random(void *d, size_t count, cudnnDataType_t type, float scale, unsigned *seed) {
    size_t esz = type == CUDNN_DATA_FLOAT ? 4 : 2;
    std::vector<unsigned char> h(count * esz);
    for (size_t i = 0; i < count; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        float f = scale * (2.0f * (float)(*seed >> 8) / 16777216.0f - 1.0f);
        if (type == CUDNN_DATA_FLOAT) memcpy(&h[4 * i], &f, 4);
        else if (type == CUDNN_DATA_HALF) { __half v = __float2half(f); memcpy(&h[2 * i], &v, 2); }
        else { __nv_bfloat16 v = __float2bfloat16(f); memcpy(&h[2 * i], &v, 2); }
    }
    CHECK_CUDA(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
}

int main(int argc, char **argv) {
    cudnnDataType_t type = CUDNN_DATA_FLOAT;
    cudnnTensorFormat_t fmt = CUDNN_TENSOR_NHWC;
    int first = 1; /* the first search's tensors: 1 random data (as the stages search now), 0 zeros */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "fp32")) type = CUDNN_DATA_FLOAT;
        else if (!strcmp(argv[i], "fp16")) type = CUDNN_DATA_HALF;
        else if (!strcmp(argv[i], "bf16")) type = CUDNN_DATA_BFLOAT16;
        else if (!strcmp(argv[i], "nhwc")) fmt = CUDNN_TENSOR_NHWC;
        else if (!strcmp(argv[i], "nchw")) fmt = CUDNN_TENSOR_NCHW;
        else if (!strcmp(argv[i], "zeros-first")) first = 0;
        else {
            fprintf(stderr, "bench_conv_algos: unknown argument '%s' (expected fp32|fp16|bf16, nhwc|nchw, zeros-first)\n",
                    argv[i]);
            return 2;
        }
    }
    int ngpu = 0;
    if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu == 0) {
        printf("SKIP: bench_conv_algos: no CUDA device visible — nothing measured\n");
        return 0;
    }
    const char *rep = getenv("BENCH_REPEAT");
    int repeat = rep && atoi(rep) > 0 ? atoi(rep) : 50, batch = 128;
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreate(&stream));
    Conv v = {};
    CHECK_CUDNN(cudnnCreate(&v.h));
    CHECK_CUDNN(cudnnSetStream(v.h, stream));
    size_t esz = type == CUDNN_DATA_FLOAT ? 4 : 2;
    /* fp32: CUDNN_DEFAULT_MATH lets cuDNN use TF32 (PyTorch's allow_tf32 default); 16-bit: tensor cores */
    v.base = type == CUDNN_DATA_FLOAT ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH;
    printf("bench_conv_algos: %s, cuDNN %zu | ResNet-18 (CIFAR) convolutions, batch %d, %s %s | µs per launch, "
           "mean of %d back to back on random data\n",
           prop.name, cudnnGetVersion(), batch, type == CUDNN_DATA_FLOAT ? "fp32 (TF32)" : type == CUDNN_DATA_HALF ? "fp16" : "bf16",
           fmt == CUDNN_TENSOR_NHWC ? "channels-last" : "NCHW", repeat);
    const char *set[2] = {"zeros", "data"};
    char name[4][32] = {"heuristic"};
    snprintf(name[1], sizeof name[1], "Find #1 on %s", set[first]);
    snprintf(name[2], sizeof name[2], "Find #2 on %s", set[first]);
    snprintf(name[3], sizeof name[3], "Find on %s", set[!first]);
    warm_up(stream, prop.multiProcessorCount);
    printf("%-23s %-5s %2s | %-11s | %-20s | %-20s | %-20s\n", "layer", "pass", "×", name[0], name[1], name[2], name[3]);
    double total[4] = {0, 0, 0, 0}; /* heuristic, Find #1 on zeros, Find #2 on zeros, Find on data */
    int differ[4] = {0, 0, 0, 0}, rows = 0;
    unsigned seed = 12345;
    for (const Shape &s : SHAPES) {
        int ho = (s.hw + 2 * s.pad - s.k) / s.stride + 1;
        CHECK_CUDNN(cudnnCreateTensorDescriptor(&v.x));
        CHECK_CUDNN(cudnnCreateTensorDescriptor(&v.y));
        CHECK_CUDNN(cudnnCreateFilterDescriptor(&v.w));
        CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&v.c));
        CHECK_CUDNN(cudnnSetTensor4dDescriptor(v.x, fmt, type, batch, s.cin, s.hw, s.hw));
        CHECK_CUDNN(cudnnSetTensor4dDescriptor(v.y, fmt, type, batch, s.cout, ho, ho));
        CHECK_CUDNN(cudnnSetFilter4dDescriptor(v.w, type, fmt, s.cout, s.cin, s.k, s.k));
        CHECK_CUDNN(cudnnSetConvolution2dDescriptor(v.c, s.pad, s.pad, s.stride, s.stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
        size_t nx = (size_t)batch * s.cin * s.hw * s.hw, ny = (size_t)batch * s.cout * ho * ho,
               nw = (size_t)s.cout * s.cin * s.k * s.k;
        CHECK_CUDA(cudaMalloc(&v.dx, nx * esz));
        CHECK_CUDA(cudaMalloc(&v.zx, nx * esz));
        CHECK_CUDA(cudaMalloc(&v.dy, ny * esz));
        CHECK_CUDA(cudaMalloc(&v.zy, ny * esz));
        CHECK_CUDA(cudaMalloc(&v.dw, nw * esz));
        CHECK_CUDA(cudaMalloc(&v.zw, nw * esz));
        /* the search's workspace: the most any algorithm asks for, up to the cap (as ops_cuda.c) */
        v.ws_bytes = 0;
        for (int pass = 0; pass < PASSES; pass++)
            for (int math : {(int)v.base, (int)CUDNN_TENSOR_OP_MATH}) {
                CHECK_CUDNN(cudnnSetConvolutionMathType(v.c, (cudnnMathType_t)math));
                int count = pass == FWD ? (int)CUDNN_CONVOLUTION_FWD_ALGO_COUNT
                            : pass == BWD_DATA ? (int)CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT
                                               : (int)CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
                for (int a = 0; a < count; a++) {
                    size_t b = workspace(v, pass, a);
                    if (b != SIZE_MAX && b <= WS_CAP) v.ws_bytes = std::max(v.ws_bytes, b);
                }
            }
        CHECK_CUDA(cudaMalloc(&v.ws, v.ws_bytes ? v.ws_bytes : 1));
        for (int pass = 0; pass < PASSES; pass++) {
            if (pass == BWD_DATA && !s.dgrad) continue;
            /* Fresh values before each pass: a timed launch writes the other set's buffers. */
            fill_random(v.dx, nx, type, 1.0f, &seed);
            fill_random(v.dy, ny, type, 1.0f, &seed);
            fill_random(v.dw, nw, type, 1.0f / sqrtf((float)s.cin * s.k * s.k), &seed);
            zero(v, nx, ny, nw, esz);
            /* The heuristic; then Find three times: on `first` (the first search of this shape in the
             * process, as a stage's search runs), on `first` again, and on the other set. */
            Pick pk[4] = {choose(v, pass, -1), choose(v, pass, first), choose(v, pass, first), choose(v, pass, !first)};
            double t[4];
            for (int i = 0; i < 4; i++) { /* each distinct pick timed once, on the random data */
                t[i] = -1;
                for (int j = 0; j < i; j++)
                    if (pk[j].algo == pk[i].algo && pk[j].math == pk[i].math) t[i] = t[j];
                if (t[i] < 0) t[i] = time_us(v, pass, pk[i], 1, repeat, stream);
                total[i] += s.count * t[i];
                differ[i] += pk[i].algo != pk[0].algo || pk[i].math != pk[0].math;
            }
            rows++;
            char col[4][48];
            for (int i = 0; i < 4; i++) {
                int o = snprintf(col[i], sizeof col[i], "a%d%s %6.1f", pk[i].algo,
                                 pk[i].math == CUDNN_TENSOR_OP_MATH ? "t" : "", t[i]);
                if (i) snprintf(col[i] + o, sizeof col[i] - o, " (%6.1f)", 1e3 * pk[i].reported_ms);
            }
            printf("%-23s %-5s %2d | %-11s | %-20s | %-20s | %-20s\n", s.name, PASS[pass], s.count, col[0], col[1],
                   col[2], col[3]);
        }
        cudaFree(v.dx), cudaFree(v.zx), cudaFree(v.dy), cudaFree(v.zy), cudaFree(v.dw), cudaFree(v.zw), cudaFree(v.ws);
        cudnnDestroyTensorDescriptor(v.x), cudnnDestroyTensorDescriptor(v.y);
        cudnnDestroyFilterDescriptor(v.w), cudnnDestroyConvolutionDescriptor(v.c);
    }
    printf("\naN: cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t N (t: tensor-op math), then its time here on random "
           "data; (in brackets: the time Find reported for it)\n");
    printf("per step (each row × its count):\n");
    for (int i = 0; i < 4; i++)
        printf("  %-17s %6.0f µs  %+6.0f µs (%+5.1f%%) against the heuristic; another algorithm in %2d of %d rows\n",
               name[i], total[i], total[i] - total[0], 100 * (total[i] - total[0]) / total[0], differ[i], rows);
    cudnnDestroy(v.h);
    cudaStreamDestroy(stream);
    return 0;
}
