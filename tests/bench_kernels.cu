/* bench_kernels.cu — every kernel of common/kernels.cu and common/adam.cu, checked against the CPU
 * reference and timed against the memory system's peak: `make bench-kernels` (llm.c's dev/cuda style).
 *
 *     make bench-kernels                       every row
 *     make bench-kernels KERNELS="bn_ sgd"     the rows whose "kernel variant" contains one of them
 *     build/cuda/tests/bench_kernels --list    the rows, nothing run
 *
 * What you will learn:
 *  - Our kernels do almost no arithmetic: ReLU, add, casts, pooling, batch norm, SGD and Adam move
 *    bytes. Their speed limit is the memory bandwidth (an H200 moves ~4.8 TB/s and does ~1 PFLOP/s
 *    of fp16: ~200 FLOPs per byte would be needed before arithmetic mattered), so the one number that
 *    says how good such a kernel is: bytes it must move / time, as a fraction of the peak bandwidth.
 *  - "Bytes it must move" is counted here, per tensor: every input read once, every output written
 *    once, an accumulated (+=) or in-place tensor both — the compulsory traffic. A kernel that reads
 *    its input twice (batch norm's two-pass statistics) pays for it in time, not in the count.
 *  - The same work at another width: fp16/bf16 tensors halve the bytes, so a bandwidth-bound kernel
 *    should run in about half the time; vectorised 16-byte loads (sgd_kernel_vec4) need fewer memory
 *    instructions for the same bytes; the layout (NCHW against channels-last NHWC) decides whether a
 *    warp reads neighbouring addresses.
 *  - Small tensors (the classifier's 128 × 10, one-thread GradScaler updates) cannot fill the GPU:
 *    their time is the launch, a few microseconds, whatever the kernel does — fusing them away
 *    (or a CUDA graph) is the only speed-up there.
 *  - Correct first: each row runs once from fresh inputs and is compared with the plain-C reference
 *    (common/ops_ref.c, adam.c) before it is timed. Tolerances are the CUDA op tests' (tests/
 *    test_ops_cuda.c), relative to the tensor's largest value: exact where both sides do the same
 *    IEEE operation, TOL_ELEM 1e-5 for a fused multiply-add or a float-vs-double division,
 *    TOL_SUM 1e-4 for reductions summed in another order, 2u + TOL_SUM for a 16-bit result that
 *    may round the other way (u = 2^-11 fp16, 2^-8 bf16). Any failure exits non-zero.
 *
 * Timing: BENCH_WARMUP (default 5) launches, then BENCH_REPEAT (default 50) launches each between two
 * CUDA events on the stream; the median is printed. Before each timed launch the L2 cache is flushed
 * (a memset twice its size), so every byte comes from DRAM and small tensors are not flattered by a
 * warm cache. BENCH_L2_FLUSH=0 times warm instead — closer to a training step, where a kernel's input
 * was often just written by the kernel before it — as the mean of the launches back to back between
 * one pair of events (so the host's launch gaps are not timed). Peak bandwidth: common/peak.h
 * (PEAK_GBPS=... overrides it). Rows repeat on their own outputs while timed (an SGD step applied 55
 * times): the values drift, the work does not.
 *
 * Adding a variant is one row of ROWS (below): a name, the setup of its family (inputs, reference
 * outputs, tolerances — reused by every variant of that kernel) and a lambda with the launch_* call. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <pthread.h>

/* The project's headers are C; C11's _Noreturn is C++'s [[noreturn]]. adam.h shows nvcc only the
 * launcher (adam.cu must not see device.h); this file, host code only, needs adam_step too. */
#define _Noreturn [[noreturn]]
extern "C" {
#include "device.h"
#include "kernels.h"
#include "ops_ref.h"
#include "peak.h"
#include "precision.h"
#pragma push_macro("__CUDACC__")
#undef __CUDACC__
#include "adam.h"
#pragma pop_macro("__CUDACC__")
}
#undef _Noreturn

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define TOL_ELEM 1e-5
#define TOL_SUM 1e-4
static double tol_lp(int p) { return p == PREC_FP32 ? TOL_SUM : 2 * (p == PREC_FP16 ? 1.0 / 2048 : 1.0 / 256) + TOL_SUM; }

static const float BN_MOMENTUM = 0.1f, BN_EPS = 1e-5f;

static Device GPU, CPU; /* GPU.stream is where everything runs; CPU runs adam_step's reference */
static cudaStream_t S;
static void *WS;        /* scratch device memory for a launcher that wants a workspace */
static size_t WS_BYTES = 64u << 20;

/* ---- a row's tensors ------------------------------------------------------------------------- */

enum Kind { F32, LP, I32, I64 }; /* LP: the row's 16-bit type on the device, floats on the host */
enum Role { IN, OUT, INOUT };    /* what the kernel does with it: read, write, or both */

struct Tensor {
    std::string name;
    Kind kind;
    Role role;
    int64_t count;
    int64_t swap[3] = {0, 0, 0}; /* host [A][B][C], device [A][C][B]: NCHW ↔ NHWC */
    std::vector<float> h;        /* initial values, host layout (NCHW) */
    std::vector<float> want;     /* the reference's values after the kernel (outputs only) */
    double tol = 0;              /* ‖got − want‖∞ ≤ tol · ‖want‖∞ */
    void *d = nullptr;
};

struct Row;
struct Case {
    const Row *row;
    int n, c, hw, p, nhwc, acc, relu;
    double extra;
    int64_t count;                     /* n · c · hw */
    std::vector<Tensor> t;
    double bytes = -1;                 /* set by a setup that knows better than the roles */
    float *f(int i) { return (float *)t[i].d; }
    void *v(int i) { return t[i].d; }
    int32_t *i32(int i) { return (int32_t *)t[i].d; }
    int64_t *i64(int i) { return (int64_t *)t[i].d; }
    float *H(int i) { return t[i].h.data(); }    /* reference inputs */
    float *W(int i) { return t[i].want.data(); } /* reference outputs (start as a copy of h) */
};

struct Row {
    const char *kernel;    /* the launcher, without launch_ */
    const char *variant;   /* what distinguishes this row ("" when nothing does) */
    void (*setup)(Case &); /* the family's inputs, reference outputs and tolerances */
    void (*launch)(Case &);/* what is timed */
    int n, c, hw;          /* shape (elementwise rows: count = n · c · hw) */
    int p;                 /* 0 fp32, 1 fp16, 2 bf16, BOTH: fp16 and bf16, ALL: all three */
    int nhwc, acc;         /* channels-last tensors; accumulate (+=) into the output */
    double extra;          /* family-specific (sgd's skip flag, amp's found_inf, ...) */
    int relu;              /* batch norm with its ReLU fused */
};
enum { BOTH = 3, ALL = 4 };
static std::vector<int> types_of(const Row &r) {
    return r.p == BOTH ? std::vector<int>{1, 2} : r.p == ALL ? std::vector<int>{0, 1, 2} : std::vector<int>{r.p};
}

static uint64_t rng_state;
static float uniform(float lo, float hi) { /* splitmix64 → [lo, hi) */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (float)((z >> 40) * (1.0 / 16777216.0));
}

/* A tensor of `count` values uniform in [lo, hi) (rounded to the row's type when 16-bit, so the
 * device holds exactly what the reference reads). */
static Tensor &add(Case &k, const char *name, Kind kind, Role role, int64_t count, float lo, float hi,
                   double tol = 0) {
    k.t.emplace_back();
    Tensor &t = k.t.back();
    t.name = name, t.kind = kind, t.role = role, t.count = count, t.tol = tol;
    t.h.resize(count);
    for (auto &x : t.h) x = uniform(lo, hi);
    if (kind == I32 || kind == I64)
        for (auto &x : t.h) x = floorf(x);
    if (kind == LP) precision_round_array((Precision)k.p, count, t.h.data());
    if (role != IN) t.want = t.h;
    return t;
}
static void channels_last(Tensor &t, int64_t a, int64_t b, int64_t c) { t.swap[0] = a, t.swap[1] = b, t.swap[2] = c; }

static int esize(const Case &k, Kind kind) { return kind == LP && k.p ? 2 : kind == I64 ? 8 : 4; }

/* host [A][B][C] ↔ device [A][C][B] */
static std::vector<float> permute(const Tensor &t, const std::vector<float> &x, int to_device) {
    if (!t.swap[0]) return x;
    int64_t A = t.swap[0], B = t.swap[1], C = t.swap[2];
    std::vector<float> y(x.size());
    for (int64_t a = 0; a < A; a++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < C; c++) {
                int64_t host = (a * B + b) * C + c, dev = (a * C + c) * B + b;
                if (to_device) y[dev] = x[host];
                else y[host] = x[dev];
            }
    return y;
}

static void upload(Case &k, Tensor &t) {
    size_t bytes = (size_t)t.count * esize(k, t.kind);
    CHECK(cudaMalloc(&t.d, bytes > 0 ? bytes : 1));
    std::vector<float> x = permute(t, t.h, 1);
    std::vector<char> buf(bytes);
    if (t.kind == F32 || (t.kind == LP && !k.p)) memcpy(buf.data(), x.data(), bytes);
    else if (t.kind == LP) precision_pack((Precision)k.p, t.count, x.data(), (uint16_t *)buf.data());
    else if (t.kind == I32) for (int64_t i = 0; i < t.count; i++) ((int32_t *)buf.data())[i] = (int32_t)x[i];
    else for (int64_t i = 0; i < t.count; i++) ((int64_t *)buf.data())[i] = (int64_t)x[i];
    CHECK(cudaMemcpy(t.d, buf.data(), bytes, cudaMemcpyHostToDevice));
}

static std::vector<float> download(Case &k, Tensor &t) {
    size_t bytes = (size_t)t.count * esize(k, t.kind);
    std::vector<char> buf(bytes);
    std::vector<float> x(t.count);
    CHECK(cudaMemcpy(buf.data(), t.d, bytes, cudaMemcpyDeviceToHost));
    if (t.kind == F32 || (t.kind == LP && !k.p)) memcpy(x.data(), buf.data(), bytes);
    else if (t.kind == LP) precision_unpack((Precision)k.p, t.count, (const uint16_t *)buf.data(), x.data());
    else if (t.kind == I32) for (int64_t i = 0; i < t.count; i++) x[i] = (float)((int32_t *)buf.data())[i];
    else for (int64_t i = 0; i < t.count; i++) x[i] = (float)((int64_t *)buf.data())[i];
    return permute(t, x, 0);
}

/* ================================================================================================
 * Families: each setup makes the tensors its launch lambdas index (k.f(0), k.v(1), ...) in the order
 * listed, fills them, and runs the reference on the host copies.
 * ============================================================================================== */

/* ---- fp32 elementwise ---------------------------------------------------------------------------- */

/* x → y */
static void relu_fwd_setup(Case &k) {
    add(k, "x", F32, IN, k.count, -1, 1);
    add(k, "y", F32, OUT, k.count, 0, 0);
    ref_relu_forward_f32(k.count, k.H(0), k.W(1));
}
/* y (ReLU's output), dy → dx */
static void relu_bwd_setup(Case &k) {
    Tensor &y = add(k, "y", F32, IN, k.count, -1, 1);
    for (auto &v : y.h) v = v < 0 ? 0 : v;
    add(k, "dy", F32, IN, k.count, -1, 1);
    add(k, "dx", F32, k.acc ? INOUT : OUT, k.count, -1, 1);
    ref_relu_backward_f32(k.count, k.H(0), k.H(1), k.W(2), k.acc);
}
/* a, b → y */
static void add_fwd_setup(Case &k) {
    add(k, "a", F32, IN, k.count, -1, 1);
    add(k, "b", F32, IN, k.count, -1, 1);
    add(k, "y", F32, OUT, k.count, 0, 0);
    ref_add_forward_f32(k.count, k.H(0), k.H(1), k.W(2));
}
/* src → dst (copied or added) */
static void grad_pass_setup(Case &k) {
    add(k, "src", F32, IN, k.count, -1, 1);
    add(k, "dst", F32, k.acc ? INOUT : OUT, k.count, -1, 1);
    ref_grad_pass_f32(k.count, k.H(0), k.W(1), k.acc);
}
/* x *= 0.5 */
static void scale_setup(Case &k) {
    add(k, "x", F32, INOUT, k.count, -1, 1);
    ref_scale_inplace_f32(k.count, k.W(0), 0.5f);
}
/* x; y += x */
static void add_inplace_setup(Case &k) {
    add(k, "x", F32, IN, k.count, -1, 1);
    add(k, "y", F32, INOUT, k.count, -1, 1);
    ref_add_inplace_f32(k.count, k.H(0), k.W(1));
}
/* x [n][c][hw] → y [n][c] */
static void avgpool_fwd_setup(Case &k) {
    add(k, "x", F32, IN, k.count, -1, 1);
    add(k, "y", F32, OUT, (int64_t)k.n * k.c, 0, 0, TOL_ELEM);
    ref_avgpool_forward_f32(k.n, k.c, k.hw, k.H(0), k.W(1));
}
/* dy [n][c] → dx [n][c][hw] */
static void avgpool_bwd_setup(Case &k) {
    add(k, "dy", F32, IN, (int64_t)k.n * k.c, -1, 1);
    add(k, "dx", F32, k.acc ? INOUT : OUT, k.count, -1, 1, TOL_ELEM);
    ref_avgpool_backward_f32(k.n, k.c, k.hw, k.H(0), k.W(1), k.acc);
}
/* b [out]; y [n][out] += b (the reference: the linear layer with no inputs is its bias) */
static void bias_add_setup(Case &k) {
    add(k, "b", F32, IN, k.c, -1, 1);
    add(k, "y", F32, INOUT, (int64_t)k.n * k.c, -1, 1);
    std::vector<float> bias((size_t)k.n * k.c);
    ref_linear_forward_f32(k.n, 0, k.c, NULL, NULL, k.H(0), bias.data());
    ref_add_inplace_f32((int64_t)k.n * k.c, bias.data(), k.W(1));
}
/* dy [n][out]; db += Σ_rows dy (the linear layer's backward with no inputs) */
static void bias_grad_setup(Case &k) {
    add(k, "dy", F32, IN, (int64_t)k.n * k.c, -1, 1);
    add(k, "db", F32, INOUT, k.c, -1, 1, TOL_SUM);
    float none;
    ref_linear_backward_f32(k.n, 0, k.c, NULL, NULL, k.H(0), NULL, &none, k.W(1), 0);
}
/* logits [n][classes], labels [n] → loss, correct, dlogits (scale 1/n) */
static void xent_setup(Case &k) {
    add(k, "logits", F32, IN, (int64_t)k.n * k.c, -4, 4);
    Tensor &lab = add(k, "labels", I32, IN, k.n, 0, (float)k.c);
    add(k, "loss", F32, OUT, 1, 0, 0, TOL_ELEM);
    add(k, "correct", I32, OUT, 1, 0, 0);
    add(k, "dlogits", F32, OUT, (int64_t)k.n * k.c, 0, 0, TOL_ELEM);
    std::vector<int32_t> labels(lab.h.begin(), lab.h.end());
    int32_t correct = 0;
    ref_xent_forward_backward_f32(k.n, k.c, k.H(0), labels.data(), 1.0f / k.n, k.W(2), &correct, k.W(4));
    k.t[3].want[0] = (float)correct;
}

/* ---- optimizers ------------------------------------------------------------------------------------ */
static const float LR = 0.1f, MOMENTUM = 0.9f, WD = 5e-4f;

/* params, grads, momentum buffer (not the first step), skip flag = extra → the SGD step (none when
 * the flag is set) */
static void sgd_setup(Case &k) {
    add(k, "params", F32, INOUT, k.count, -1, 1, TOL_ELEM);
    add(k, "grads", F32, IN, k.count, -1, 1);
    add(k, "momentum", F32, INOUT, k.count, -1, 1, TOL_ELEM);
    Tensor &skip = add(k, "skip", F32, IN, 1, 0, 0);
    skip.h[0] = (float)k.extra;
    if (k.extra == 0) ref_sgd_step_f32(k.count, k.W(0), k.H(1), k.W(2), LR, MOMENTUM, WD, 0);
    else k.bytes = 4; /* skipped: the flag is all it reads */
}
/* params, grads, exp_avg, exp_avg_sq → step 3 of Adam; the reference is adam_step on the CPU. */
static void adam_setup(Case &k) {
    add(k, "params", F32, INOUT, k.count, -1, 1, TOL_ELEM);
    add(k, "grads", F32, IN, k.count, -1, 1);
    add(k, "exp_avg", F32, INOUT, k.count, -0.1f, 0.1f, TOL_ELEM);
    add(k, "exp_avg_sq", F32, INOUT, k.count, 0, 0.01f, TOL_ELEM);
    adam_step(&CPU, k.count, k.W(0), k.H(1), k.W(2), k.W(3), 1e-3, ADAM_BETA1, ADAM_BETA2, ADAM_EPS, WD, 3);
}
static void adam_launch(Case &k) {
    adam_step(&GPU, k.count, k.f(0), k.f(1), k.f(2), k.f(3), 1e-3, ADAM_BETA1, ADAM_BETA2, ADAM_EPS, WD, 3);
}
/* The same under the GradScaler (adam_step_unless): a skip flag, and the step count on the device —
 * 2 steps taken before, in the workspace (followed by the scalars), so the first launch is step 3.
 * Later (timed) launches count on: the time is the same. */
static void adam_unless_setup(Case &k) {
    adam_setup(k);
    add(k, "skip", F32, IN, 1, 0, 0).h[0] = 0.0f;
    int64_t two = 2;
    cudaMemcpy(WS, &two, sizeof two, cudaMemcpyHostToDevice);
}
static void adam_unless_launch(Case &k) {
    adam_step_unless(&GPU, k.count, k.f(0), k.f(1), k.f(2), k.f(3), 1e-3, ADAM_BETA1, ADAM_BETA2, ADAM_EPS, WD,
                     (int64_t *)WS, (AdamScalars *)((int64_t *)WS + 1), k.f(4));
}

/* ---- 16-bit elementwise, casts and layouts ----------------------------------------------------------- */
static Precision P(const Case &k) { return (Precision)k.p; }

/* fp32 src → 16-bit dst */
static void cast_to_setup(Case &k) {
    add(k, "src", F32, IN, k.count, -4, 4);
    add(k, "dst", LP, OUT, k.count, 0, 0);
    ref_cast_to_lp(P(k), k.count, k.H(0), k.W(1));
}
/* 16-bit src → fp32 dst */
static void cast_from_setup(Case &k) {
    add(k, "src", LP, IN, k.count, -1, 1);
    add(k, "dst", F32, OUT, k.count, -1, 1);
    ref_cast_from_lp(k.count, k.H(0), k.W(1));
}
/* dst += src where src ≠ 0, src = 0: a quarter of src zero (the places between two layers) */
static void cast_add_clear_setup(Case &k) {
    Tensor &src = add(k, "src", LP, INOUT, k.count, -1, 1);
    for (int64_t i = 0; i < k.count / 4; i++) src.h[i] = src.want[i] = 0.f;
    add(k, "dst", F32, INOUT, k.count, -1, 1);
    ref_cast_add_clear_lp(k.count, k.W(0), k.W(1));
}
/* x → y; ReLU of a 16-bit value is that value or 0: the fp32 reference is exact */
static void relu_fwd_lp_setup(Case &k) {
    add(k, "x", LP, IN, k.count, -1, 1);
    add(k, "y", LP, OUT, k.count, 0, 0);
    ref_relu_forward_f32(k.count, k.H(0), k.W(1));
}
static void relu_bwd_lp_setup(Case &k) {
    Tensor &y = add(k, "y", LP, IN, k.count, -1, 1);
    for (auto &v : y.h) v = v < 0 ? 0 : v;
    add(k, "dy", LP, IN, k.count, -1, 1);
    add(k, "dx", LP, k.acc ? INOUT : OUT, k.count, -1, 1);
    ref_relu_backward_lp(P(k), k.count, k.H(0), k.H(1), k.W(2), k.acc);
}
static void add_fwd_lp_setup(Case &k) {
    add(k, "a", LP, IN, k.count, -1, 1);
    add(k, "b", LP, IN, k.count, -1, 1);
    add(k, "y", LP, OUT, k.count, 0, 0);
    ref_add_forward_lp(P(k), k.count, k.H(0), k.H(1), k.W(2));
}
/* the end of a residual block: y = ReLU(a + b); backward: dy masked by y > 0 into da (+=) and db */
static void add_relu_fwd_setup(Case &k) {
    add_fwd_lp_setup(k);
    ref_relu_forward_f32(k.count, k.W(2), k.W(2));
}
static void add_relu_bwd_setup(Case &k) {
    Tensor &y = add(k, "y", LP, IN, k.count, -1, 1);
    for (auto &v : y.h) v = v < 0 ? 0 : v;
    add(k, "dy", LP, IN, k.count, -1, 1);
    add(k, "da", LP, INOUT, k.count, -1, 1);
    add(k, "db", LP, OUT, k.count, -1, 1);
    ref_add_relu_backward_lp(P(k), k.count, k.H(0), k.H(1), k.W(2), 1, k.W(3), 0);
}
static void grad_pass_lp_setup(Case &k) {
    add(k, "src", LP, IN, k.count, -1, 1);
    add(k, "dst", LP, k.acc ? INOUT : OUT, k.count, -1, 1);
    ref_grad_pass_lp(P(k), k.count, k.H(0), k.W(1), k.acc);
}
/* x [n][c][hw] (NHWC on the device when the row says so) → y [n][c] */
static void avgpool_fwd_lp_setup(Case &k) {
    Tensor &x = add(k, "x", LP, IN, k.count, -1, 1);
    if (k.nhwc) channels_last(x, k.n, k.c, k.hw);
    add(k, "y", LP, OUT, (int64_t)k.n * k.c, 0, 0, tol_lp(k.p));
    ref_avgpool_forward_lp(P(k), k.n, k.c, k.hw, k.H(0), k.W(1));
}
static void avgpool_bwd_lp_setup(Case &k) {
    add(k, "dy", LP, IN, (int64_t)k.n * k.c, -1, 1);
    Tensor &dx = add(k, "dx", LP, k.acc ? INOUT : OUT, k.count, -1, 1, tol_lp(k.p));
    if (k.nhwc) channels_last(dx, k.n, k.c, k.hw);
    ref_avgpool_backward_lp(P(k), k.n, k.c, k.hw, k.H(0), k.W(1), k.acc);
}
/* fp32 [n][c][hw] → 16-bit [n][hw][c] (the input batch, channels-last) */
static void cast_nhwc_setup(Case &k) {
    add(k, "src", F32, IN, k.count, -2, 2);
    channels_last(add(k, "dst", LP, OUT, k.count, 0, 0), k.n, k.c, k.hw);
    ref_cast_to_lp(P(k), k.count, k.H(0), k.W(1));
}
/* b [out] → y [n][out] = b (the GEMM's C operand) */
static void bias_fill_lp_setup(Case &k) {
    add(k, "b", LP, IN, k.c, -1, 1);
    add(k, "y", LP, OUT, (int64_t)k.n * k.c, 0, 0);
    ref_linear_forward_lp(P(k), k.n, 0, k.c, NULL, NULL, k.H(0), k.W(1));
}
/* dy [n][out] → db = Σ_rows dy, rounded once (fresh, overwritten) */
static void bias_grad_lp_setup(Case &k) {
    add(k, "dy", LP, IN, (int64_t)k.n * k.c, -1, 1);
    add(k, "db", LP, OUT, k.c, 0, 0, tol_lp(k.p));
    float none;
    ref_linear_backward_lp(P(k), k.n, 0, k.c, NULL, NULL, k.H(0), NULL, &none, k.W(1), 0);
}

/* ---- batch norm, 16-bit activations, fp32 statistics ----------------------------------------------------
 * Tensors: 0 x, 1 gamma, 2 beta, then
 *   train:    3 running_mean, 4 running_var, 5 save_mean, 6 save_invstd, 7 y
 *   eval:     3 running_mean, 4 running_var, 5 y
 *   backward: 3 dy, 4 save_mean, 5 save_invstd, 6 dx, 7 dgamma, 8 dbeta (+ 9 y with a fused ReLU)
 * x, y, dy, dx are channels-last on the device when the row says nhwc. A row with .relu = 1 (a fused
 * BN + ReLU launcher) gets y = ReLU(BN(x)) as its reference, and in backward dy masked by y > 0. */
static void bn_common(Case &k) {
    Tensor &x = add(k, "x", LP, IN, k.count, -2, 3);
    if (k.nhwc) channels_last(x, k.n, k.c, k.hw);
    add(k, "gamma", F32, IN, k.c, 0.5f, 1.5f);
    add(k, "beta", F32, IN, k.c, -0.5f, 0.5f);
}
static void bn_train_setup(Case &k) {
    bn_common(k);
    add(k, "running_mean", F32, INOUT, k.c, -0.2f, 0.2f, TOL_SUM);
    add(k, "running_var", F32, INOUT, k.c, 0.5f, 2, TOL_SUM);
    add(k, "save_mean", F32, OUT, k.c, 0, 0, TOL_SUM);
    add(k, "save_invstd", F32, OUT, k.c, 0, 0, TOL_SUM);
    Tensor &y = add(k, "y", LP, OUT, k.count, 0, 0, tol_lp(k.p));
    if (k.nhwc) channels_last(y, k.n, k.c, k.hw);
    ref_bn_forward_train_lp(P(k), k.n, k.c, k.hw, k.H(0), k.H(1), k.H(2), k.W(3), k.W(4), BN_MOMENTUM, BN_EPS,
                            k.W(5), k.W(6), k.W(7));
    if (k.relu) ref_relu_forward_f32(k.count, k.W(7), k.W(7));
}
static void bn_eval_setup(Case &k) {
    bn_common(k);
    add(k, "running_mean", F32, IN, k.c, -0.2f, 0.2f);
    add(k, "running_var", F32, IN, k.c, 0.5f, 2);
    Tensor &y = add(k, "y", LP, OUT, k.count, 0, 0, tol_lp(k.p));
    if (k.nhwc) channels_last(y, k.n, k.c, k.hw);
    ref_bn_forward_eval_lp(P(k), k.n, k.c, k.hw, k.H(0), k.H(1), k.H(2), k.H(3), k.H(4), BN_EPS, k.W(5));
    if (k.relu) ref_relu_forward_f32(k.count, k.W(5), k.W(5));
}
static void bn_bwd_setup(Case &k) {
    bn_common(k);
    Tensor &dy = add(k, "dy", LP, IN, k.count, -1, 1);
    if (k.nhwc) channels_last(dy, k.n, k.c, k.hw);
    /* the statistics backward reads are the forward's: run the reference forward for them */
    std::vector<float> rm(k.c, 0.f), rv(k.c, 1.f), y(k.count);
    add(k, "save_mean", F32, IN, k.c, 0, 0);
    add(k, "save_invstd", F32, IN, k.c, 0, 0);
    ref_bn_forward_train_lp(P(k), k.n, k.c, k.hw, k.H(0), k.H(1), k.H(2), rm.data(), rv.data(), BN_MOMENTUM,
                            BN_EPS, k.H(4), k.H(5), y.data());
    Tensor &dx = add(k, "dx", LP, k.acc ? INOUT : OUT, k.count, -1, 1, tol_lp(k.p));
    if (k.nhwc) channels_last(dx, k.n, k.c, k.hw);
    add(k, "dgamma", F32, INOUT, k.c, -1, 1, TOL_SUM);
    add(k, "dbeta", F32, INOUT, k.c, -1, 1, TOL_SUM);
    std::vector<float> g(k.t[3].h);
    if (k.relu) { /* the fused kernel reads y and masks dy itself */
        ref_relu_forward_f32(k.count, y.data(), y.data());
        Tensor &yt = add(k, "y", LP, IN, k.count, 0, 0);
        yt.h = y;
        if (k.nhwc) channels_last(yt, k.n, k.c, k.hw);
        ref_relu_backward_f32(k.count, y.data(), g.data(), g.data(), 0);
    }
    ref_bn_backward_lp(P(k), k.n, k.c, k.hw, k.H(0), g.data(), k.H(1), k.H(4), k.H(5), BN_EPS, k.W(6), k.W(7),
                       k.W(8), k.acc);
}

/* ---- GradScaler ------------------------------------------------------------------------------------ */

/* x *= *alpha (a device scalar) */
static void scale_dev_setup(Case &k) {
    add(k, "x", F32, INOUT, k.count, -1, 1);
    add(k, "alpha", F32, IN, 1, 0, 0).h[0] = 0.5f;
    ref_scale_by_device(k.count, k.W(0), k.H(1));
}
/* grads (scaled by 65536; one inf when extra = 1), inv_scale, found_inf → unscaled, flag */
static void unscale_setup(Case &k) {
    Tensor &g = add(k, "grads", F32, INOUT, k.count, -65536, 65536);
    if (k.extra) g.h[k.count / 2] = g.want[k.count / 2] = INFINITY;
    add(k, "inv_scale", F32, IN, 1, 0, 0).h[0] = 1.0f / 65536;
    add(k, "found_inf", F32, INOUT, 1, 0, 0);
    ref_amp_unscale_check(k.count, k.W(0), k.H(1), k.W(2));
}
/* scale, inv_scale, growth tracker, found_inf = extra, skipped → the scaler's update, one thread
 * (tracker at 1999 of 2000: a finite step grows the scale, an inf halves it) */
static void update_scale_setup(Case &k) {
    Tensor &sc = add(k, "scale", F32, INOUT, 1, 0, 0);
    sc.h[0] = sc.want[0] = 65536;
    add(k, "inv_scale", F32, INOUT, 1, 0, 0);
    Tensor &tr = add(k, "tracker", I32, INOUT, 1, 0, 0);
    tr.h[0] = tr.want[0] = 1999;
    Tensor &fi = add(k, "found_inf", F32, INOUT, 1, 0, 0);
    fi.h[0] = fi.want[0] = (float)k.extra;
    add(k, "skipped", I64, INOUT, 1, 0, 0);
    int32_t tracker = 1999;
    int64_t skipped = 0;
    ref_amp_update_scale(k.W(0), k.W(1), &tracker, k.W(3), &skipped, 2.0, 0.5, 2000);
    k.t[2].want[0] = (float)tracker, k.t[4].want[0] = (float)skipped;
}
/* x (1% zeros, a few inf and NaN) → counts[0] += zeros, counts[1] += non-finite */
static void count_setup(Case &k) {
    Tensor &x = add(k, "x", F32, IN, k.count, -1, 1);
    for (int64_t i = 0; i < k.count; i += 97) x.h[i] = 0;
    for (int64_t i = 13; i < k.count; i += k.count / 7) x.h[i] = i % 2 ? INFINITY : NAN;
    add(k, "counts", I64, INOUT, 2, 0, 0);
    int64_t counts[2] = {0, 0};
    ref_count_zero_nonfinite(k.count, k.H(0), counts);
    k.t[1].want[0] = (float)counts[0], k.t[1].want[1] = (float)counts[1];
}

/* ---- gradient clipping ------------------------------------------------------------------------------ */

/* grads (small values and one spike) → norm, coef, clipped: clip_grad_norm_'s sum of squares (a fixed
 * grid of CLIP_PARTS blocks, partial sums in double, in WS) and its one-thread coefficient; the
 * multiply that follows is scale_by_device's row. A double sum in another order: the norm may round
 * to a neighbouring float. */
static void clip_setup(Case &k) {
    Tensor &g = add(k, "grads", F32, IN, k.count, -0.01f, 0.01f);
    g.h[k.count / 2] = 3.0f;
    add(k, "norm", F32, OUT, 1, 0, 0, 1e-6);
    add(k, "coef", F32, OUT, 1, 0, 0, 1e-6);
    add(k, "clipped", I64, INOUT, 1, 0, 0);
    int64_t clipped = 0;
    ref_clip_norm_coef(k.count, k.H(0), 1.0f, k.W(1), k.W(2), &clipped);
    k.t[3].want[0] = (float)clipped;
}

/* ================================================================================================
 * The rows. Shapes are ResNet-18's at batch 128 (CIFAR): ACT is the largest activation (layer 1,
 * 128 × 64 × 32 × 32), POOL the last one (128 × 512 × 4 × 4), HEAD the classifier (128 × 10),
 * PARAMS the whole model (11,173,962 floats: what the optimizer, the weight cast and the GradScaler
 * sweep), WEIGHT the largest convolution weight (512 × 512 × 3 × 3), BATCH the input (128 × 3 × 32 × 32).
 * ============================================================================================== */
#define ACT 128, 64, 1024
#define POOL 128, 512, 16
#define HEAD 128, 10, 1
#define PARAMS 1, 1, 11173962
#define PARAMS4 1, 1, 11173964 /* rounded up to a multiple of 4 (see the sgd rows) */
#define WEIGHT 512, 512, 9
#define BATCH 128, 3, 1024
#define L(...) [](Case &k) { __VA_ARGS__; }

static const Row ROWS[] = {
    /* kernel, variant, setup, launch, shape, p, nhwc, acc, extra, relu */
    {"relu_forward", "", relu_fwd_setup, L(launch_relu_forward(S, k.count, k.f(0), k.f(1))), ACT},
    {"relu_backward", "", relu_bwd_setup, L(launch_relu_backward(S, k.count, k.f(0), k.f(1), k.f(2), k.acc)), ACT},
    {"add_forward", "", add_fwd_setup, L(launch_add_forward(S, k.count, k.f(0), k.f(1), k.f(2))), ACT},
    {"grad_pass", "copy", grad_pass_setup, L(launch_grad_pass(S, k.count, k.f(0), k.f(1), k.acc)), ACT},
    {"grad_pass", "", grad_pass_setup, L(launch_grad_pass(S, k.count, k.f(0), k.f(1), k.acc)), ACT, 0, 0, 1},
    {"scale_inplace", "", scale_setup, L(launch_scale_inplace(S, k.count, k.f(0), 0.5f)), ACT},
    {"add_inplace", "", add_inplace_setup, L(launch_add_inplace(S, k.count, k.f(0), k.f(1))), ACT},
    {"avgpool_forward", "", avgpool_fwd_setup, L(launch_avgpool_forward(S, k.n, k.c, k.hw, k.f(0), k.f(1))), POOL},
    {"avgpool_backward", "", avgpool_bwd_setup,
     L(launch_avgpool_backward(S, k.n, k.c, k.hw, k.f(0), k.f(1), k.acc)), POOL},
    {"bias_add", "", bias_add_setup, L(launch_bias_add(S, k.n, k.c, k.f(0), k.f(1))), HEAD},
    {"bias_grad", "", bias_grad_setup, L(launch_bias_grad(S, k.n, k.c, k.f(0), k.f(1))), HEAD},
    {"xent_forward_backward", "", xent_setup,
     L(launch_xent_forward_backward(S, k.n, k.c, k.f(0), k.i32(1), 1.0f / k.n, k.f(2), k.i32(3), k.f(4))), HEAD},

    /* SGD: launch_sgd_step picks sgd_kernel_vec4 when the count is a multiple of 4 and the pointers
     * are 16-byte aligned, else sgd_kernel. ResNet-18's 11,173,962 parameters leave 2 over, so the
     * model's own step runs the scalar kernel; 11,173,964 (padded) runs the vector one. */
    {"sgd_step", "sgd_kernel (model's count)", sgd_setup,
     L(launch_sgd_step(S, k.count, k.f(0), k.f(1), k.f(2), LR, MOMENTUM, WD, 0)), PARAMS},
    {"sgd_step", "sgd_kernel_vec4 (padded)", sgd_setup,
     L(launch_sgd_step(S, k.count, k.f(0), k.f(1), k.f(2), LR, MOMENTUM, WD, 0)), PARAMS4},
    {"sgd_step_unless", "skip=0, vec4", sgd_setup,
     L(launch_sgd_step_unless(S, k.count, k.f(0), k.f(1), k.f(2), LR, MOMENTUM, WD, 0, k.f(3))), PARAMS4},
    {"sgd_step_unless", "skip=1 (nothing written)", sgd_setup,
     L(launch_sgd_step_unless(S, k.count, k.f(0), k.f(1), k.f(2), LR, MOMENTUM, WD, 0, k.f(3))), PARAMS4, 0, 0, 0, 1},
    {"adam_step", "adam.cu", adam_setup, adam_launch, PARAMS},
    {"adam_step_unless", "adam.cu, skip=0: step count on the device", adam_unless_setup, adam_unless_launch, PARAMS},

    /* 16-bit: each row runs for fp16 and bf16 */
    {"cast_to", "weights", cast_to_setup, L(launch_cast_to(S, k.p, k.count, k.f(0), k.v(1))), PARAMS, BOTH},
    {"cast_from", "16-bit gradients back", cast_from_setup, L(launch_cast_from(S, k.p, k.count, k.v(0), k.f(1))),
     WEIGHT, BOTH},
    {"cast_add_clear", "weight grads into .grad", cast_add_clear_setup,
     L(launch_cast_add_clear(S, k.p, k.count, k.v(0), k.f(1))), WEIGHT, BOTH},
    {"relu_forward_lp", "", relu_fwd_lp_setup, L(launch_relu_forward_lp(S, k.p, k.count, k.v(0), k.v(1))), ACT, BOTH},
    {"relu_backward_lp", "", relu_bwd_lp_setup,
     L(launch_relu_backward_lp(S, k.p, k.count, k.v(0), k.v(1), k.v(2), k.acc)), ACT, BOTH},
    {"add_forward_lp", "", add_fwd_lp_setup, L(launch_add_forward_lp(S, k.p, k.count, k.v(0), k.v(1), k.v(2))), ACT,
     BOTH},
    {"add_relu_forward", "", add_relu_fwd_setup, L(launch_add_relu_forward(S, k.p, k.count, k.v(0), k.v(1), k.v(2))),
     ACT, ALL},
    {"add_relu_backward", "", add_relu_bwd_setup,
     L(launch_add_relu_backward(S, k.p, k.count, k.v(0), k.v(1), k.v(2), 1, k.v(3), 0)), ACT, ALL},
    {"grad_pass_lp", "copy", grad_pass_lp_setup, L(launch_grad_pass_lp(S, k.p, k.count, k.v(0), k.v(1), k.acc)), ACT,
     BOTH},
    {"grad_pass_lp", "", grad_pass_lp_setup, L(launch_grad_pass_lp(S, k.p, k.count, k.v(0), k.v(1), k.acc)), ACT,
     BOTH, 0, 1},
    {"avgpool_forward_lp", "", avgpool_fwd_lp_setup,
     L(launch_avgpool_forward_lp(S, k.p, k.nhwc, k.n, k.c, k.hw, k.v(0), k.v(1))), POOL, BOTH},
    {"avgpool_forward_lp", "", avgpool_fwd_lp_setup,
     L(launch_avgpool_forward_lp(S, k.p, k.nhwc, k.n, k.c, k.hw, k.v(0), k.v(1))), POOL, BOTH, 1},
    {"avgpool_backward_lp", "", avgpool_bwd_lp_setup,
     L(launch_avgpool_backward_lp(S, k.p, k.nhwc, k.n, k.c, k.hw, k.v(0), k.v(1), k.acc)), POOL, BOTH},
    {"avgpool_backward_lp", "", avgpool_bwd_lp_setup,
     L(launch_avgpool_backward_lp(S, k.p, k.nhwc, k.n, k.c, k.hw, k.v(0), k.v(1), k.acc)), POOL, BOTH, 1},
    {"cast_to_nhwc", "input batch", cast_nhwc_setup, L(launch_cast_to_nhwc(S, k.p, k.n, k.c, k.hw, k.f(0), k.v(1))),
     BATCH, BOTH},
    {"bias_fill_lp", "", bias_fill_lp_setup, L(launch_bias_fill_lp(S, k.p, k.n, k.c, k.v(0), k.v(1))), HEAD, BOTH},
    {"bias_grad_lp", "", bias_grad_lp_setup, L(launch_bias_grad_lp(S, k.p, k.n, k.c, k.v(0), k.v(1))), HEAD, BOTH},

    /* ==== batch norm ============================================================================
     * The launchers take a fused-ReLU flag (k.relu, the row's last field) and a scratch (WS, larger
     * than launch_bn_scratch_floats asks for at these shapes). Layer 1's shape (few channels,
     * many values each) and layer 4's (many channels, 2,048 values each), NCHW and NHWC; NHWC also
     * in fp32, stage 1's batch norm (the same kernels, T = float). */
#define BN_TRAIN L(launch_bn_forward_train_lp(S, k.p, k.nhwc, k.n, k.c, k.hw, k.v(0), k.f(1), k.f(2), k.f(3), k.f(4), \
                                                BN_MOMENTUM, BN_EPS, k.f(5), k.f(6), k.v(7), k.relu, (float *)WS, nullptr))
#define BN_EVAL L(launch_bn_forward_eval_lp(S, k.p, k.nhwc, k.n, k.c, k.hw, k.v(0), k.f(1), k.f(2), k.f(3), k.f(4), \
                                              BN_EPS, k.v(5)))
#define BN_BWD L(launch_bn_backward_lp(S, k.p, k.nhwc, k.n, k.c, k.hw, k.v(0), k.relu ? k.v(9) : nullptr, k.v(3), \
                                         k.f(1), k.f(4), k.f(5), k.v(6), k.f(7), k.f(8), k.acc, k.relu, (float *)WS, nullptr))
    {"bn_forward_train_lp", "", bn_train_setup, BN_TRAIN, ACT, BOTH, 0},
    {"bn_forward_train_lp", "", bn_train_setup, BN_TRAIN, ACT, ALL, 1},
    {"bn_forward_train_lp", "", bn_train_setup, BN_TRAIN, POOL, BOTH, 0},
    {"bn_forward_train_lp", "", bn_train_setup, BN_TRAIN, POOL, ALL, 1},
    {"bn_forward_eval_lp", "", bn_eval_setup, BN_EVAL, ACT, BOTH, 0},
    {"bn_forward_eval_lp", "", bn_eval_setup, BN_EVAL, ACT, ALL, 1},
    {"bn_forward_eval_lp", "", bn_eval_setup, BN_EVAL, POOL, BOTH, 0},
    {"bn_forward_eval_lp", "", bn_eval_setup, BN_EVAL, POOL, ALL, 1},
    {"bn_backward_lp", "", bn_bwd_setup, BN_BWD, ACT, BOTH, 0},
    {"bn_backward_lp", "", bn_bwd_setup, BN_BWD, ACT, ALL, 1},
    {"bn_backward_lp", "", bn_bwd_setup, BN_BWD, POOL, BOTH, 0},
    {"bn_backward_lp", "", bn_bwd_setup, BN_BWD, POOL, ALL, 1},
    /* the fused ReLU, as the model runs every BN followed by a ReLU */
    {"bn_forward_train_lp", "relu", bn_train_setup, BN_TRAIN, ACT, ALL, 1, 0, 0, 1},
    {"bn_backward_lp", "relu", bn_bwd_setup, BN_BWD, ACT, ALL, 1, 0, 0, 1},
    /* ==== end of batch norm ===================================================================== */

    /* GradScaler (fp32, the whole gradient) */
    {"scale_by_device", "", scale_dev_setup, L(launch_scale_by_device(S, k.count, k.f(0), k.f(1))), PARAMS},
    {"amp_unscale_check", "finite", unscale_setup, L(launch_amp_unscale_check(S, k.count, k.f(0), k.f(1), k.f(2))),
     PARAMS},
    {"amp_unscale_check", "one inf", unscale_setup, L(launch_amp_unscale_check(S, k.count, k.f(0), k.f(1), k.f(2))),
     PARAMS, 0, 0, 0, 1},
    {"amp_update_scale", "grow", update_scale_setup,
     L(launch_amp_update_scale(S, k.f(0), k.f(1), k.i32(2), k.f(3), k.i64(4), 2.0, 0.5, 2000)), 1, 1, 1},
    {"amp_update_scale", "back off", update_scale_setup,
     L(launch_amp_update_scale(S, k.f(0), k.f(1), k.i32(2), k.f(3), k.i64(4), 2.0, 0.5, 2000)), 1, 1, 1, 0, 0, 0, 1},
    {"count_zero_nonfinite", "", count_setup, L(launch_count_zero_nonfinite(S, k.count, k.f(0), k.i64(1))), PARAMS},

    /* gradient clipping (--clip-grad-norm: the whole gradient) */
    {"clip_norm_coef", "", clip_setup,
     L(launch_clip_norm_coef(S, k.count, k.f(0), (double *)WS, CLIP_PARTS, 1.0f, k.f(1), k.f(2), k.i64(3))), PARAMS},
};

/* ================================================================================================
 * The harness: validate once, then time.
 * ============================================================================================== */

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static std::string label(const Row &r, int p, int nhwc) {
    std::string s = r.variant;
    if (p || r.p == ALL) s += std::string(s.empty() ? "" : ", ") + precision_name((Precision)p);
    if (r.setup == bn_train_setup || r.setup == bn_eval_setup || r.setup == bn_bwd_setup || nhwc ||
        r.setup == avgpool_fwd_lp_setup || r.setup == avgpool_bwd_lp_setup)
        s += nhwc ? " nhwc" : " nchw";
    if (r.acc && !strstr(r.variant, "+=") && !strstr(r.variant, "copy")) s += s.empty() ? "+=" : ", +=";
    return s;
}

static std::string shape(const Row &r) {
    char b[64];
    if (r.n == 1 && r.c == 1) snprintf(b, sizeof b, "%d", r.hw);
    else if (r.hw == 1) snprintf(b, sizeof b, "%dx%d", r.n, r.c);
    else if (r.hw == 1024) snprintf(b, sizeof b, "%dx%dx32x32", r.n, r.c);
    else if (r.hw == 16) snprintf(b, sizeof b, "%dx%dx4x4", r.n, r.c);
    else if (r.hw == 9) snprintf(b, sizeof b, "%dx%dx3x3", r.n, r.c);
    else snprintf(b, sizeof b, "%dx%dx%d", r.n, r.c, r.hw);
    return b;
}

/* ‖got − want‖∞ and that over ‖want‖∞; NaN matches NaN and ±inf itself. */
static void compare(const std::vector<float> &got, const std::vector<float> &want, double *abs_err, double *rel_err) {
    double e = 0, m = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double a = got[i], b = want[i];
        if ((isnan(a) && isnan(b)) || a == b) {
            if (isfinite(b)) m = std::max(m, fabs(b));
            continue;
        }
        double d = isfinite(a) && isfinite(b) ? fabs(a - b) : INFINITY;
        e = std::max(e, d);
        if (isfinite(b)) m = std::max(m, fabs(b));
    }
    *abs_err = e;
    *rel_err = e == 0 ? 0 : m > 0 ? e / m : INFINITY;
}

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Runs one row at one type: 1 PASS, 0 FAIL. */
static int run(const Row &r, int p, double peak_gbps, void *flush, size_t flush_bytes, int warmup, int repeat) {
    Case k;
    k.row = &r, k.n = r.n, k.c = r.c, k.hw = r.hw, k.p = p, k.nhwc = r.nhwc, k.acc = r.acc, k.extra = r.extra;
    k.relu = r.relu, k.count = (int64_t)r.n * r.c * r.hw;
    k.t.reserve(16);
    rng_state = 0x5eed + 7919 * (uint64_t)(&r - ROWS) + 104729 * (uint64_t)p;
    r.setup(k);
    double bytes = 0;
    for (auto &t : k.t) bytes += (double)t.count * esize(k, t.kind) * (t.role == INOUT ? 2 : 1);
    if (k.bytes >= 0) bytes = k.bytes;
    for (auto &t : k.t) upload(k, t);
    /* cudaMemcpy from pageable memory may return before its DMA has landed, and S (a non-blocking
     * stream) does not wait for the legacy stream that carries it: without this, a launch could run
     * before its inputs arrive and an upload overwrite its output (seen once, in one row of 87). */
    CHECK(cudaDeviceSynchronize());

    /* 1. correctness, from fresh inputs */
    r.launch(k);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(S));
    double worst_abs = 0, worst_rel = 0, worst_tol = 0;
    std::string failed;
    for (auto &t : k.t) {
        if (t.role == IN) continue;
        double a, e;
        compare(download(k, t), t.want, &a, &e);
        if (e > t.tol && failed.empty()) failed = t.name;
        if (e >= worst_rel) worst_rel = e, worst_abs = a, worst_tol = t.tol;
    }

    /* 2. time: warm-up; then, flushing, each launch between two events after an L2 flush (the flush
     *    keeps the GPU busy while the host queues the next launch, so no host gap is timed) and the
     *    median; warm, one event pair around all the launches back to back, and the mean. */
    for (int i = 0; i < warmup; i++) r.launch(k);
    int pairs = flush ? repeat : 1;
    std::vector<cudaEvent_t> ev(2 * pairs);
    for (auto &e : ev) CHECK(cudaEventCreate(&e));
    for (int i = 0; i < repeat; i++) {
        if (flush) CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, S));
        if (flush || i == 0) CHECK(cudaEventRecord(ev[flush ? 2 * i : 0], S));
        r.launch(k);
        if (flush || i == repeat - 1) CHECK(cudaEventRecord(ev[flush ? 2 * i + 1 : 1], S));
    }
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(S));
    std::vector<float> ms(pairs);
    for (int i = 0; i < pairs; i++) CHECK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
    if (!flush) ms[0] /= repeat;
    for (auto &e : ev) CHECK(cudaEventDestroy(e));
    for (auto &t : k.t) CHECK(cudaFree(t.d));
    double us = 1e3 * median(ms), gbps = bytes / (us * 1e-6) / 1e9;

    char peak[16], tol[16];
    if (isfinite(peak_gbps)) snprintf(peak, sizeof peak, "%.1f%%", 100 * gbps / peak_gbps);
    else snprintf(peak, sizeof peak, "n/a");
    if (worst_tol) snprintf(tol, sizeof tol, "%.0e", worst_tol);
    else snprintf(tol, sizeof tol, "exact");
    printf("%-22s %-28s %-14s %9.2f %9.1f %8.0f %7s %11.3g %8.2g %6s  %s%s%s\n", r.kernel,
           label(r, p, r.nhwc).c_str(), shape(r).c_str(), us, bytes / 1e6, gbps, peak, worst_abs, worst_rel, tol,
           failed.empty() ? "PASS" : "FAIL", failed.empty() ? "" : ": ", failed.c_str());
    return failed.empty();
}

int main(int argc, char **argv) {
    int list = argc > 1 && !strcmp(argv[1], "--list");
    std::vector<std::string> filters;
    for (int i = 1 + list; i < argc; i++)
        if (argv[i][0]) filters.push_back(argv[i]);
    auto wanted = [&](const Row &r, int p) {
        if (filters.empty()) return true;
        std::string name = std::string(r.kernel) + " " + label(r, p, r.nhwc);
        for (auto &f : filters)
            if (name.find(f) != std::string::npos) return true;
        return false;
    };
    if (list) {
        for (const Row &r : ROWS)
            for (int p : types_of(r))
                if (wanted(r, p)) printf("%-22s %-28s %s\n", r.kernel, label(r, p, r.nhwc).c_str(), shape(r).c_str());
        return 0;
    }
    if (device_cuda_count() == 0) {
        printf("SKIP: bench_kernels: no CUDA device visible — nothing validated or timed\n");
        return 0;
    }
    device_init(&CPU, DEV_CPU, 0, -1);
    device_init(&GPU, DEV_CUDA, 0, 0);
    S = GPU.stream;
    CHECK(cudaMalloc(&WS, WS_BYTES));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    int l2 = 0, major = prop.major;
    CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
    char source[200];
    double peak = peak_mem_gbps(0, source, sizeof source);
    int warmup = env_int("BENCH_WARMUP", 5), repeat = std::max(1, env_int("BENCH_REPEAT", 50));
    size_t flush_bytes = env_int("BENCH_L2_FLUSH", 1) && l2 > 0 ? 2 * (size_t)l2 : 0;
    void *flush = NULL;
    if (flush_bytes) CHECK(cudaMalloc(&flush, flush_bytes));

    printf("bench_kernels: %s (sm_%d%d, %d SMs, L2 %.0f MiB) | peak memory bandwidth ", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, l2 / 1048576.0);
    if (isfinite(peak)) printf("%.0f GB/s (%s)\n", peak, source);
    else printf("n/a (%s)\n", source);
    printf("timing: %s of %d launches after %d warm-up, %s | MB: what each launch must move (inputs read "
           "once, outputs written once, += and in-place both) | GB/s = MB / us × 1e-3\n",
           flush ? "median" : "mean", repeat, warmup,
           flush ? "L2 flushed before each (from DRAM)" : "back to back, L2 warm (BENCH_L2_FLUSH=0)");
    printf("check: max abs err = ‖got − want‖∞ against the CPU reference, rel err = that / ‖want‖∞ (worst output "
           "tensor), tol = its tolerance\n");
    printf("%-22s %-28s %-14s %9s %9s %8s %7s %11s %8s %6s  %s\n", "kernel", "variant", "shape", "us", "MB", "GB/s",
           "of peak", "max abs err", "rel err", "tol", "check");
    int fails = 0, rows = 0;
    for (const Row &r : ROWS)
        for (int p : types_of(r)) {
            if (!wanted(r, p)) continue;
            if (p == PREC_BF16 && major < 8) {
                printf("%-22s %-28s SKIP: bf16 needs compute capability 8.0 (this GPU: %d.x)\n", r.kernel,
                       label(r, p, r.nhwc).c_str(), major);
                continue;
            }
            fails += !run(r, p, peak, flush, flush_bytes, warmup, repeat);
            rows++;
        }
    if (rows == 0) printf("bench_kernels: no row matches the filter (see --list)\n");
    printf("bench_kernels: %d row%s, %d failed validation\n", rows, rows == 1 ? "" : "s", fails);
    if (flush) cudaFree(flush);
    cudaFree(WS);
    device_destroy(&GPU);
    return fails ? 1 : 0;
}
