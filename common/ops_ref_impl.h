/* ops_ref_impl.h — the plain C reference of every op, written once for an element type.
 *
 * Included by ops_ref.c with T (the element type) and S (the name suffix) defined, once for
 * float/_f32 (the CPU backend) and once for double/_f64 (the gradient checks). Every function has
 * exactly the semantics documented in ops.h. Deliberately no header guard: each inclusion stamps
 * out one more copy. Helpers are static and suffixed too, so the two copies never collide.
 *
 * Convolution is where the time goes, so it is where we work for speed: im2col turns a convolution
 * into a matrix product, and one small cache-blocked GEMM (below) does all the arithmetic of conv
 * forward, backward-data, backward-filter and linear. The convolutions, batch norm and ReLU share
 * their work out over the CPU threads (cpu_threads.h); everything else is a straightforward loop.
 * Every output element has a fixed summation order, whatever the thread count and whichever of the
 * micro-kernel's builds runs: results are reproducible bit for bit. Batch-norm statistics,
 * pooling sums and softmax sums accumulate in double. */

#if !defined(T) || !defined(S)
#error "define T (element type) and S (name suffix) before including ops_ref_impl.h"
#endif

/* Type-independent definitions, made once. */
#ifndef OPS_REF_IMPL_ONCE
#define OPS_REF_IMPL_ONCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_threads.h"
#include "errors.h"
#include "ops_ref.h"

/* Under AddressSanitizer + UBSan (make sanitize) a check on every load and every address keeps the
 * micro-kernel's accumulators in memory and its loop scalar: it ran 20× slower than without and took
 * 84% of a sanitized training step. So that one loop is built without instrumentation
 * (REF_UNCHECKED), and its caller asks ASan, once per call, whether the whole region it is about to
 * read is addressable (REF_CHECK_READ); the writes to C stay in instrumented code. Outside sanitizer
 * builds both are nothing. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define REF_UNCHECKED __attribute__((no_sanitize("address", "undefined")))
#define REF_CHECK_READ(p, bytes)                                                                   \
    do {                                                                                           \
        if (__asan_region_is_poisoned((void *)(p), (bytes))) {                                     \
            fprintf(stderr, "%s:%d: GEMM micro-kernel would read outside its packed tile\n",      \
                    __FILE__, __LINE__);                                                           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)
#elif defined(__SANITIZE_THREAD__) /* the packed tiles are the thread's own: nothing to race on */
#define REF_UNCHECKED __attribute__((no_sanitize("thread")))
#define REF_CHECK_READ(p, bytes) ((void)0)
#else
#define REF_UNCHECKED
#define REF_CHECK_READ(p, bytes) ((void)0)
#endif

/* The micro-kernel is built twice on x86-64, for the baseline (SSE2) and for AVX2, and the loader
 * picks the one the CPU runs (GCC/clang function multi-versioning: an ifunc). AVX2 doubles the
 * vector width; it does not fuse the multiply-add (that needs -mfma, which we do not ask for), so
 * both builds round every product and every sum alike and give the same bits, only faster. Not in
 * sanitizer builds: the loader runs the picker before the sanitizer's runtime is up, and an
 * instrumented picker crashes there. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define REF_NO_CLONES
#endif
#endif
#if defined(__x86_64__) && defined(__has_attribute) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__) && !defined(REF_NO_CLONES)
#if __has_attribute(target_clones)
#define REF_SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef REF_SIMD_CLONES
#define REF_SIMD_CLONES
#endif

#define REF_PASTE_(a, b) a##b
#define REF_PASTE(a, b) REF_PASTE_(a, b)
#define REF_FN(name) REF_PASTE(name, S) /* gemm → gemm_f32 */

/* GEMM blocking, in elements. One MC×KC block of A (≈128 KB in float) stays in L2 while we sweep
 * across NC columns of B; one KC×NR sliver of packed B (8 KB) stays in L1 across all the MR-row
 * tiles of that block. The micro-tile is MR rows × NR columns of C held in registers: NR is two
 * SSE vectors of T (x86-64's baseline; we are compiled without -march=native), and 4×2 vector
 * accumulators + 2 for B + broadcasts of A fit in the 16 XMM registers. */
#define REF_MC 128
#define REF_KC 256
#define REF_NC 2048
#define REF_MR 4

/* Per-thread grow-only scratch (im2col columns and GEMM packing), so the step never mallocs once
 * warmed up, and stage 2's threads — each driving its own replica — never share a buffer. */
enum { REF_SCRATCH_COL, REF_SCRATCH_PACK_A, REF_SCRATCH_PACK_B, REF_SCRATCH_COUNT };
#include <pthread.h>
#endif /* OPS_REF_IMPL_ONCE */

#define REF_NR ((int)(32 / sizeof(T))) /* 8 floats or 4 doubles: two 16-byte vectors */

/* ---- scratch ----------------------------------------------------------------------------------- */

/* Each thread keeps its high-water mark for its lifetime, and the buffers are freed when the thread
 * exits (a pthread key's destructor), because stage 2 creates new threads every step, as PyTorch's
 * DataParallel does. Contents are not preserved when a slot grows. */
static _Thread_local T *REF_FN(scratch_buf)[REF_SCRATCH_COUNT];
static _Thread_local size_t REF_FN(scratch_cap)[REF_SCRATCH_COUNT];
static pthread_key_t REF_FN(scratch_key);
static pthread_once_t REF_FN(scratch_once) = PTHREAD_ONCE_INIT;

/* Runs at thread exit with the thread's buffer array (its TLS is still valid then). */
static void REF_FN(scratch_release)(void *bufs) {
    T **b = bufs;
    for (int i = 0; i < REF_SCRATCH_COUNT; i++) free(b[i]), b[i] = NULL, REF_FN(scratch_cap)[i] = 0;
}
static void REF_FN(scratch_key_create)(void) {
    if (pthread_key_create(&REF_FN(scratch_key), REF_FN(scratch_release)) != 0)
        die_at(__FILE__, __LINE__, "pthread_key_create", "no thread-specific key left", NULL);
}

static T *REF_FN(scratch)(int slot, size_t count) {
    if (count > REF_FN(scratch_cap)[slot]) {
        pthread_once(&REF_FN(scratch_once), REF_FN(scratch_key_create));
        /* a non-NULL value arms the destructor for this thread */
        pthread_setspecific(REF_FN(scratch_key), REF_FN(scratch_buf));
        free(REF_FN(scratch_buf)[slot]);
        size_t bytes = (count * sizeof(T) + 63) & ~(size_t)63; /* aligned_alloc wants a multiple */
        REF_FN(scratch_buf)[slot] = aligned_alloc(64, bytes);
        if (!REF_FN(scratch_buf)[slot])
            die_at(__FILE__, __LINE__, "aligned_alloc", "out of host memory for CPU conv scratch",
                   "lower --batch-size");
        REF_FN(scratch_cap)[slot] = count;
    }
    return REF_FN(scratch_buf)[slot];
}

/* ---- GEMM: C[M][N] += A·B ---------------------------------------------------------------------- */
/* A(m,k) = A[m*a_rs + k*a_cs] and B(k,n) = B[k*b_rs + n*b_cs]: arbitrary strides, so one routine
 * serves A·B, Aᵀ·B and A·Bᵀ. C is row-major with leading dimension ldc and is accumulated into.
 * Blocks of A and B are first copied ("packed") into contiguous, zero-padded tiles, so the inner
 * kernel reads both operands sequentially and never has to handle a ragged edge. */

/* Pack rows [0, mb) × cols [0, kb) of A into tiles of REF_MR rows: Ap[tile][k][r]. */
static void REF_FN(pack_a)(int mb, int kb, const T *A, int64_t a_rs, int64_t a_cs,
                           T *restrict Ap) {
    for (int m0 = 0; m0 < mb; m0 += REF_MR) {
        for (int k = 0; k < kb; k++)
            for (int r = 0; r < REF_MR; r++)
                *Ap++ = m0 + r < mb ? A[(int64_t)(m0 + r) * a_rs + (int64_t)k * a_cs] : (T)0;
    }
}

/* Pack rows [0, kb) × cols [0, nb) of B into slivers of REF_NR columns: Bp[sliver][k][c]. */
static void REF_FN(pack_b)(int kb, int nb, const T *B, int64_t b_rs, int64_t b_cs,
                           T *restrict Bp) {
    for (int n0 = 0; n0 < nb; n0 += REF_NR) {
        int w = nb - n0 < REF_NR ? nb - n0 : REF_NR;
        for (int k = 0; k < kb; k++) {
            const T *row = B + (int64_t)k * b_rs + (int64_t)n0 * b_cs;
            int c = 0;
            if (b_cs == 1)
                for (; c < w; c++) Bp[c] = row[c]; /* the common case: a plain copy */
            else
                for (; c < w; c++) Bp[c] = row[(int64_t)c * b_cs];
            for (; c < REF_NR; c++) Bp[c] = 0;
            Bp += REF_NR;
        }
    }
}

/* The micro-kernel: the REF_MR × REF_NR product of a packed A tile and a packed B sliver over kb,
 * into acc. Fixed trip counts let the compiler unroll the r/c loops, keep acc in registers and
 * vectorise over c (each element's sum still runs over k in order). It reads only a and b (checked by its caller under ASan, see REF_UNCHECKED). */
static REF_UNCHECKED REF_SIMD_CLONES void REF_FN(micro_kernel)(int kb, const T *restrict a, const T *restrict b,
                                               T acc[REF_MR][REF_NR]) {
    T t[REF_MR][REF_NR] = {{0}};
    for (int k = 0; k < kb; k++) {
        for (int r = 0; r < REF_MR; r++) {
            T ar = a[r];
            for (int c = 0; c < REF_NR; c++) t[r][c] += ar * b[c];
        }
        a += REF_MR;
        b += REF_NR;
    }
    memcpy(acc, t, sizeof t);
}

/* C (mr × nr valid of an REF_MR × REF_NR tile, leading dimension ldc) += the tile's product. */
static void REF_FN(tile)(int kb, const T *a, const T *b, T *restrict C, int64_t ldc, int mr, int nr) {
    T acc[REF_MR][REF_NR];
    REF_CHECK_READ(a, (size_t)kb * REF_MR * sizeof(T));
    REF_CHECK_READ(b, (size_t)kb * REF_NR * sizeof(T));
    REF_FN(micro_kernel)(kb, a, b, acc);
    if (mr == REF_MR && nr == REF_NR) {
        for (int r = 0; r < REF_MR; r++)
            for (int c = 0; c < REF_NR; c++) C[r * ldc + c] += acc[r][c];
    } else {
        for (int r = 0; r < mr; r++)
            for (int c = 0; c < nr; c++) C[r * ldc + c] += acc[r][c];
    }
}

static void REF_FN(gemm)(int M, int N, int K, const T *A, int64_t a_rs, int64_t a_cs, const T *B,
                         int64_t b_rs, int64_t b_cs, T *C, int64_t ldc) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    int mc_max = M < REF_MC ? M : REF_MC, nc_max = N < REF_NC ? N : REF_NC;
    int kc_max = K < REF_KC ? K : REF_KC;
    T *Ap = REF_FN(scratch)(REF_SCRATCH_PACK_A,
                            (size_t)((mc_max + REF_MR - 1) / REF_MR * REF_MR) * kc_max);
    T *Bp = REF_FN(scratch)(REF_SCRATCH_PACK_B,
                            (size_t)((nc_max + REF_NR - 1) / REF_NR * REF_NR) * kc_max);
    for (int n0 = 0; n0 < N; n0 += REF_NC) {
        int nb = N - n0 < REF_NC ? N - n0 : REF_NC;
        for (int k0 = 0; k0 < K; k0 += REF_KC) { /* C gets one partial sum per k-block, in order */
            int kb = K - k0 < REF_KC ? K - k0 : REF_KC;
            REF_FN(pack_b)(kb, nb, B + (int64_t)k0 * b_rs + (int64_t)n0 * b_cs, b_rs, b_cs, Bp);
            for (int m0 = 0; m0 < M; m0 += REF_MC) {
                int mb = M - m0 < REF_MC ? M - m0 : REF_MC;
                REF_FN(pack_a)(mb, kb, A + (int64_t)m0 * a_rs + (int64_t)k0 * a_cs, a_rs, a_cs, Ap);
                for (int j = 0; j < nb; j += REF_NR) {
                    const T *bs = Bp + (int64_t)j * kb; /* sliver j/NR starts at (j/NR)·kb·NR */
                    for (int i = 0; i < mb; i += REF_MR) {
                        int mr = mb - i < REF_MR ? mb - i : REF_MR;
                        int nr = nb - j < REF_NR ? nb - j : REF_NR;
                        /* tile i/MR of packed A starts at (i/MR)·kb·MR = i·kb */
                        REF_FN(tile)(kb, Ap + (int64_t)i * kb, bs, C + (int64_t)(m0 + i) * ldc + n0 + j,
                                     ldc, mr, nr);
                    }
                }
            }
        }
    }
}

/* ---- convolution via im2col ---------------------------------------------------------------------- */
/* For one image, col[(ci·k + ki)·k + kj][oh·wout + ow] = x[ci][oh·s − pad + ki][ow·s − pad + kj]
 * (0 outside the image). Then y = W[cout][cin·k·k] · col, a single GEMM per image. */

/* Output columns ow whose input column ow·s − pad + kj lies inside [0, w): the range [*lo, *hi). */
static inline void REF_FN(valid_range)(int kj, int stride, int pad, int w, int wout, int *lo,
                                       int *hi) {
    int a = pad - kj; /* need ow·s ≥ a */
    int l = a > 0 ? (a + stride - 1) / stride : 0;
    int b = w + pad - kj; /* need ow·s < b */
    int h = b > 0 ? (b + stride - 1) / stride : 0;
    *lo = l < wout ? l : wout;
    *hi = h < wout ? h : wout;
    if (*hi < *lo) *hi = *lo;
}

/* Rows [lo, hi) of one image's col, written from col[0]: the weight gradient's threads each build
 * the rows of the columns they own. */
static void REF_FN(im2col_rows)(const ConvShape *s, const T *restrict x, T *restrict col, int lo, int hi) {
    int k = s->k, st = s->stride, pad = s->pad, P = s->hout * s->wout;
    for (int r = lo; r < hi; r++) {
        int ci = r / (k * k), ki = r / k % k, kj = r % k;
        T *row = col + (int64_t)(r - lo) * P;
        int l, h;
        REF_FN(valid_range)(kj, st, pad, s->w, s->wout, &l, &h);
        for (int oh = 0; oh < s->hout; oh++) {
            T *out = row + oh * s->wout;
            int ih = oh * st - pad + ki;
            if (ih < 0 || ih >= s->h) {
                memset(out, 0, sizeof(T) * s->wout);
                continue;
            }
            const T *in = x + ((int64_t)ci * s->h + ih) * s->w - pad + kj;
            int ow = 0;
            for (; ow < l; ow++) out[ow] = 0;
            for (; ow < h; ow++) out[ow] = in[ow * st];
            for (; ow < s->wout; ow++) out[ow] = 0;
        }
    }
}

static void REF_FN(im2col)(const ConvShape *s, const T *restrict x, T *restrict col) {
    REF_FN(im2col_rows)(s, x, col, 0, s->cin * s->k * s->k);
}

/* The adjoint of im2col: dx[ci][ih][iw] += every col entry that was copied from it. */
static void REF_FN(col2im)(const ConvShape *s, const T *restrict col, T *restrict dx) {
    int k = s->k, st = s->stride, pad = s->pad, P = s->hout * s->wout;
    for (int ci = 0; ci < s->cin; ci++)
        for (int ki = 0; ki < k; ki++)
            for (int kj = 0; kj < k; kj++) {
                const T *row = col + (int64_t)((ci * k + ki) * k + kj) * P;
                int lo, hi;
                REF_FN(valid_range)(kj, st, pad, s->w, s->wout, &lo, &hi);
                for (int oh = 0; oh < s->hout; oh++) {
                    int ih = oh * st - pad + ki;
                    if (ih < 0 || ih >= s->h) continue;
                    const T *g = row + oh * s->wout;
                    T *out = dx + ((int64_t)ci * s->h + ih) * s->w - pad + kj;
                    for (int ow = lo; ow < hi; ow++) out[ow * st] += g[ow];
                }
            }
}

/* A 1×1, stride-1, unpadded convolution's col is the input itself: skip the copy. */
static inline int REF_FN(conv_is_pointwise)(const ConvShape *s) {
    return s->k == 1 && s->stride == 1 && s->pad == 0;
}

/* The three convolution passes run on the CPU threads (cpu_threads.h). The forward pass and the
 * input gradient split the batch: each image is its own GEMM, so a thread owns whole images. The
 * weight gradient sums over the images, so it splits its columns instead (dW's cin·k·k axis): each
 * thread sums its own columns over every image, in image order. Either way every output element is
 * computed by one thread in the same order as with one thread: the bits do not depend on the count. */
typedef struct {
    const ConvShape *s;
    int n;
    const T *x, *w, *dy;
    T *y, *dx, *dw;
} REF_FN(ConvJob);

static void REF_FN(conv_forward_images)(void *arg, int lo, int hi) {
    const REF_FN(ConvJob) *j = arg;
    const ConvShape *s = j->s;
    int K = s->cin * s->k * s->k, P = s->hout * s->wout;
    int64_t in_img = (int64_t)s->cin * s->h * s->w, out_img = (int64_t)s->cout * P;
    int pointwise = REF_FN(conv_is_pointwise)(s);
    T *col = pointwise ? NULL : REF_FN(scratch)(REF_SCRATCH_COL, (size_t)K * P);
    for (int i = lo; i < hi; i++) {
        const T *xi = j->x + i * in_img;
        T *yi = j->y + i * out_img;
        if (!pointwise) REF_FN(im2col)(s, xi, col);
        memset(yi, 0, sizeof(T) * out_img);
        /* y[cout][P] = W[cout][K] · col[K][P] */
        REF_FN(gemm)(s->cout, P, K, j->w, K, 1, pointwise ? xi : col, P, 1, yi, P);
    }
}

void REF_FN(ref_conv_forward)(const ConvShape *s, int n, const T *x, const T *w, T *y) {
    REF_FN(ConvJob) j = {.s = s, .x = x, .w = w, .y = y};
    cpu_parallel_for(n, 1, REF_FN(conv_forward_images), &j);
}

static void REF_FN(conv_backward_data_images)(void *arg, int lo, int hi) {
    const REF_FN(ConvJob) *j = arg;
    const ConvShape *s = j->s;
    int K = s->cin * s->k * s->k, P = s->hout * s->wout;
    int64_t in_img = (int64_t)s->cin * s->h * s->w, out_img = (int64_t)s->cout * P;
    int pointwise = REF_FN(conv_is_pointwise)(s);
    T *dcol = pointwise ? NULL : REF_FN(scratch)(REF_SCRATCH_COL, (size_t)K * P);
    for (int i = lo; i < hi; i++) {
        const T *dyi = j->dy + i * out_img;
        T *dxi = j->dx + i * in_img;
        /* dcol[K][P] = Wᵀ[K][cout] · dy[cout][P]: W read transposed through its strides */
        if (pointwise) {
            REF_FN(gemm)(K, P, s->cout, j->w, 1, K, dyi, P, 1, dxi, P);
        } else {
            memset(dcol, 0, sizeof(T) * K * P);
            REF_FN(gemm)(K, P, s->cout, j->w, 1, K, dyi, P, 1, dcol, P);
            REF_FN(col2im)(s, dcol, dxi);
        }
    }
}

void REF_FN(ref_conv_backward_data)(const ConvShape *s, int n, const T *dy, const T *w, T *dx,
                                    int accumulate) {
    if (!accumulate) memset(dx, 0, sizeof(T) * s->cin * s->h * s->w * n);
    REF_FN(ConvJob) j = {.s = s, .dy = dy, .w = w, .dx = dx};
    cpu_parallel_for(n, 1, REF_FN(conv_backward_data_images), &j);
}

/* Columns [lo, hi) of dW, over every image: dW[:, lo:hi] += dy · col[lo:hi]ᵀ. */
static void REF_FN(conv_backward_filter_columns)(void *arg, int lo, int hi) {
    const REF_FN(ConvJob) *j = arg;
    const ConvShape *s = j->s;
    int K = s->cin * s->k * s->k, P = s->hout * s->wout;
    int64_t in_img = (int64_t)s->cin * s->h * s->w, out_img = (int64_t)s->cout * P;
    int pointwise = REF_FN(conv_is_pointwise)(s);
    T *col = pointwise ? NULL : REF_FN(scratch)(REF_SCRATCH_COL, (size_t)(hi - lo) * P);
    for (int i = 0; i < j->n; i++) {
        const T *xi = j->x + i * in_img;
        if (!pointwise) REF_FN(im2col_rows)(s, xi, col, lo, hi);
        /* col read transposed through its strides */
        REF_FN(gemm)(s->cout, hi - lo, P, j->dy + i * out_img, P, 1, pointwise ? xi + (int64_t)lo * P : col, 1, P,
                     j->dw + lo, K);
    }
}

void REF_FN(ref_conv_backward_filter)(const ConvShape *s, int n, const T *x, const T *dy, T *dw,
                                      int accumulate) {
    int K = s->cin * s->k * s->k;
    if (!accumulate) memset(dw, 0, sizeof(T) * s->cout * K);
    REF_FN(ConvJob) j = {.s = s, .n = n, .x = x, .dy = dy, .dw = dw};
    /* at least one micro-tile's width of columns per thread */
    cpu_parallel_for(K, REF_NR, REF_FN(conv_backward_filter_columns), &j);
}

/* ---- batch norm ---------------------------------------------------------------------------------- */
/* Channel ch of image i is the contiguous run x[(i·c + ch)·hw .. +hw). */

/* Batch norm runs on the CPU threads too, a range of channels each: a channel's sums stay in one
 * thread, in one order. */
typedef struct {
    int n, c, hw, accumulate;
    const T *x, *dy, *gamma, *beta, *save_mean_in, *save_invstd_in;
    T *running_mean, *running_var, momentum, eps, *save_mean, *save_invstd, *y, *dx, *dgamma, *dbeta;
} REF_FN(BnJob);

static void REF_FN(bn_forward_train_channels)(void *arg, int lo, int hi) {
    const REF_FN(BnJob) *b = arg;
    int n = b->n, c = b->c, hw = b->hw;
    const T *x = b->x;
    int64_t count = (int64_t)n * hw;
    for (int ch = lo; ch < hi; ch++) {
        /* Two passes (mean, then squared deviations) — stabler than E[x²] − E[x]². */
        double sum = 0;
        for (int i = 0; i < n; i++) {
            const T *xc = x + ((int64_t)i * c + ch) * hw;
            for (int j = 0; j < hw; j++) sum += xc[j];
        }
        double mean = sum / (double)count, ss = 0;
        for (int i = 0; i < n; i++) {
            const T *xc = x + ((int64_t)i * c + ch) * hw;
            for (int j = 0; j < hw; j++) ss += ((double)xc[j] - mean) * ((double)xc[j] - mean);
        }
        double var = ss / (double)count; /* biased: what normalises */
        double invstd = 1.0 / sqrt(var + (double)b->eps);
        double unbiased = ss / (double)(count - 1); /* what the running estimate tracks */
        double m = (double)b->momentum;
        b->running_mean[ch] = (T)((1.0 - m) * (double)b->running_mean[ch] + m * mean);
        b->running_var[ch] = (T)((1.0 - m) * (double)b->running_var[ch] + m * unbiased);
        b->save_mean[ch] = (T)mean;
        b->save_invstd[ch] = (T)invstd;
        T mu = (T)mean, scale = (T)(invstd * (double)b->gamma[ch]), shift = b->beta[ch];
        for (int i = 0; i < n; i++) {
            const T *xc = x + ((int64_t)i * c + ch) * hw;
            T *yc = b->y + ((int64_t)i * c + ch) * hw;
            for (int j = 0; j < hw; j++) yc[j] = (xc[j] - mu) * scale + shift;
        }
    }
}

void REF_FN(ref_bn_forward_train)(int n, int c, int hw, const T *x, const T *gamma, const T *beta,
                                  T *running_mean, T *running_var, T momentum, T eps,
                                  T *save_mean, T *save_invstd, T *y) {
    ASSERT((int64_t)n * hw > 1); /* PyTorch refuses too: the unbiased variance of one value is undefined */
    REF_FN(BnJob) b = {.n = n, .c = c, .hw = hw, .x = x, .gamma = gamma, .beta = beta,
                       .running_mean = running_mean, .running_var = running_var, .momentum = momentum,
                       .eps = eps, .save_mean = save_mean, .save_invstd = save_invstd, .y = y};
    cpu_parallel_for(c, 1, REF_FN(bn_forward_train_channels), &b);
}

void REF_FN(ref_bn_forward_eval)(int n, int c, int hw, const T *x, const T *gamma, const T *beta,
                                 const T *running_mean, const T *running_var, T eps, T *y) {
    for (int ch = 0; ch < c; ch++) {
        double invstd = 1.0 / sqrt((double)running_var[ch] + (double)eps);
        T mu = running_mean[ch], scale = (T)(invstd * (double)gamma[ch]), shift = beta[ch];
        for (int i = 0; i < n; i++) {
            const T *xc = x + ((int64_t)i * c + ch) * hw;
            T *yc = y + ((int64_t)i * c + ch) * hw;
            for (int j = 0; j < hw; j++) yc[j] = (xc[j] - mu) * scale + shift;
        }
    }
}

static void REF_FN(bn_backward_channels)(void *arg, int lo, int hi) {
    const REF_FN(BnJob) *b = arg;
    int n = b->n, c = b->c, hw = b->hw;
    const T *x = b->x, *dy = b->dy;
    T *dx = b->dx;
    double count = (double)n * hw;
    for (int ch = lo; ch < hi; ch++) {
        double mean = b->save_mean_in[ch], invstd = b->save_invstd_in[ch];
        double sum_dy = 0, sum_dy_xhat = 0;
        for (int i = 0; i < n; i++) {
            int64_t off = ((int64_t)i * c + ch) * hw;
            for (int j = 0; j < hw; j++) {
                sum_dy += dy[off + j];
                sum_dy_xhat += (double)dy[off + j] * (((double)x[off + j] - mean) * invstd);
            }
        }
        b->dbeta[ch] = (T)((double)b->dbeta[ch] + sum_dy);
        b->dgamma[ch] = (T)((double)b->dgamma[ch] + sum_dy_xhat);
        double k = (double)b->gamma[ch] * invstd, mdy = sum_dy / count, mdyx = sum_dy_xhat / count;
        for (int i = 0; i < n; i++) {
            int64_t off = ((int64_t)i * c + ch) * hw;
            for (int j = 0; j < hw; j++) {
                double xhat = ((double)x[off + j] - mean) * invstd;
                T g = (T)(k * ((double)dy[off + j] - mdy - xhat * mdyx));
                dx[off + j] = b->accumulate ? dx[off + j] + g : g;
            }
        }
    }
}

/* With x̂ = (x − μ)·invstd and N = n·hw values per channel:
 *   dβ = Σ dy,  dγ = Σ dy·x̂,  dx = γ·invstd·(dy − mean(dy) − x̂·mean(dy·x̂)).
 * eps is unused: save_invstd already contains it (the signature matches cuDNN's, which wants it). */
void REF_FN(ref_bn_backward)(int n, int c, int hw, const T *x, const T *dy, const T *gamma,
                             const T *save_mean, const T *save_invstd, T eps, T *dx, T *dgamma,
                             T *dbeta, int accumulate) {
    REF_FN(BnJob) b = {.n = n, .c = c, .hw = hw, .accumulate = accumulate, .x = x, .dy = dy, .gamma = gamma,
                       .save_mean_in = save_mean, .save_invstd_in = save_invstd, .dx = dx, .dgamma = dgamma,
                       .dbeta = dbeta};
    cpu_parallel_for(c, 1, REF_FN(bn_backward_channels), &b);
}

/* ---- elementwise ----------------------------------------------------------------------------------- */
/* No restrict here: in-place calls (x == y, dx == dy) are part of the contract. */

/* ReLU, the other big elementwise pass of a step, runs on the CPU threads in blocks of REF_BLOCK
 * elements (a range of blocks each; the last block may be short). */
#define REF_BLOCK 16384
typedef struct {
    int64_t count;
    const T *x, *dy;
    T *y, *dx;
    int accumulate;
} REF_FN(EltJob);

static void REF_FN(relu_forward_blocks)(void *arg, int lo, int hi) {
    const REF_FN(EltJob) *e = arg;
    int64_t end = (int64_t)hi * REF_BLOCK < e->count ? (int64_t)hi * REF_BLOCK : e->count;
    for (int64_t i = (int64_t)lo * REF_BLOCK; i < end; i++)
        e->y[i] = e->x[i] < 0 ? (T)0 : e->x[i]; /* NaN passes through */
}

void REF_FN(ref_relu_forward)(int64_t count, const T *x, T *y) {
    REF_FN(EltJob) e = {.count = count, .x = x, .y = y};
    cpu_parallel_for((int)((count + REF_BLOCK - 1) / REF_BLOCK), 1, REF_FN(relu_forward_blocks), &e);
}

static void REF_FN(relu_backward_blocks)(void *arg, int lo, int hi) {
    const REF_FN(EltJob) *e = arg;
    const T *y = e->x, *dy = e->dy;
    T *dx = e->dx;
    int64_t end = (int64_t)hi * REF_BLOCK < e->count ? (int64_t)hi * REF_BLOCK : e->count;
    if (e->accumulate)
        for (int64_t i = (int64_t)lo * REF_BLOCK; i < end; i++) dx[i] += y[i] > 0 ? dy[i] : (T)0;
    else
        for (int64_t i = (int64_t)lo * REF_BLOCK; i < end; i++) dx[i] = y[i] > 0 ? dy[i] : (T)0;
}

void REF_FN(ref_relu_backward)(int64_t count, const T *y, const T *dy, T *dx, int accumulate) {
    REF_FN(EltJob) e = {.count = count, .x = y, .dy = dy, .dx = dx, .accumulate = accumulate};
    cpu_parallel_for((int)((count + REF_BLOCK - 1) / REF_BLOCK), 1, REF_FN(relu_backward_blocks), &e);
}

void REF_FN(ref_add_forward)(int64_t count, const T *a, const T *b, T *y) {
    for (int64_t i = 0; i < count; i++) y[i] = a[i] + b[i];
}

void REF_FN(ref_grad_pass)(int64_t count, const T *src, T *dst, int accumulate) {
    if (accumulate)
        for (int64_t i = 0; i < count; i++) dst[i] += src[i];
    else if (dst != src)
        memmove(dst, src, sizeof(T) * count);
}

/* ---- global average pool ------------------------------------------------------------------------ */

void REF_FN(ref_avgpool_forward)(int n, int c, int hw, const T *x, T *y) {
    for (int64_t r = 0; r < (int64_t)n * c; r++) {
        double sum = 0;
        for (int j = 0; j < hw; j++) sum += x[r * hw + j];
        y[r] = (T)(sum / hw);
    }
}

void REF_FN(ref_avgpool_backward)(int n, int c, int hw, const T *dy, T *dx, int accumulate) {
    for (int64_t r = 0; r < (int64_t)n * c; r++) {
        T g = (T)((double)dy[r] / hw);
        T *d = dx + r * hw;
        if (accumulate)
            for (int j = 0; j < hw; j++) d[j] += g;
        else
            for (int j = 0; j < hw; j++) d[j] = g;
    }
}

/* ---- linear ------------------------------------------------------------------------------------- */

void REF_FN(ref_linear_forward)(int n, int in, int out, const T *x, const T *W, const T *b, T *y) {
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++) y[(int64_t)i * out + o] = b ? b[o] : (T)0;
    /* y[n][out] += x[n][in] · Wᵀ[in][out] */
    REF_FN(gemm)(n, out, in, x, in, 1, W, 1, in, y, out);
}

void REF_FN(ref_linear_backward)(int n, int in, int out, const T *x, const T *W, const T *dy,
                                 T *dx, T *dW, T *db, int accumulate) {
    if (dx) {
        if (!accumulate) memset(dx, 0, sizeof(T) * n * in);
        REF_FN(gemm)(n, in, out, dy, out, 1, W, in, 1, dx, in); /* dx[n][in] = dy · W */
    }
    REF_FN(gemm)(out, in, n, dy, 1, out, x, in, 1, dW, in); /* dW[out][in] += dyᵀ · x */
    if (db)
        for (int o = 0; o < out; o++) {
            double sum = 0;
            for (int i = 0; i < n; i++) sum += dy[(int64_t)i * out + o];
            db[o] = (T)((double)db[o] + sum);
        }
}

/* ---- softmax + cross-entropy -------------------------------------------------------------------- */
/* Row by row: logsumexp with the max subtracted (no overflow), in double. dlogits may alias logits:
 * each row's max, label logit and loss are read before any of the row is overwritten. */
void REF_FN(ref_xent_forward_backward)(int n, int classes, const T *logits,
                                       const int32_t *labels, T scale, T *loss, int32_t *correct,
                                       T *dlogits) {
    double total = 0;
    int32_t right = 0;
    for (int i = 0; i < n; i++) {
        const T *z = logits + (int64_t)i * classes;
        T *dz = dlogits + (int64_t)i * classes;
        int label = labels[i];
        ASSERT(label >= 0 && label < classes);
        int argmax = 0; /* the FIRST maximum, a NaN above all, as torch.argmax (strict >) */
        for (int j = 1; j < classes; j++)
            if (z[j] > z[argmax] || (isnan(z[j]) && !isnan(z[argmax]))) argmax = j;
        double zmax = z[argmax], sum = 0;
        for (int j = 0; j < classes; j++) sum += exp((double)z[j] - zmax);
        double lse = zmax + log(sum);
        total += lse - (double)z[label];
        right += argmax == label;
        for (int j = 0; j < classes; j++)
            dz[j] = (T)((double)scale * (exp((double)z[j] - lse) - (j == label ? 1.0 : 0.0)));
    }
    *loss = (T)((double)scale * total);
    *correct = right;
}

/* ---- optimizer and helpers ------------------------------------------------------------------------ */

/* PyTorch's SGD, in T arithmetic like torch's per-element update. */
void REF_FN(ref_sgd_step)(int64_t count, T *params, const T *grads, T *momentum_buf, T lr,
                          T momentum, T weight_decay, int first) {
    for (int64_t i = 0; i < count; i++) {
        T g = grads[i] + weight_decay * params[i];
        if (momentum != 0) {
            g = first ? g : momentum * momentum_buf[i] + g;
            momentum_buf[i] = g;
        }
        params[i] -= lr * g;
    }
}

void REF_FN(ref_scale_inplace)(int64_t count, T *x, T alpha) {
    for (int64_t i = 0; i < count; i++) x[i] *= alpha;
}

void REF_FN(ref_add_inplace)(int64_t count, const T *x, T *y) {
    for (int64_t i = 0; i < count; i++) y[i] += x[i];
}

#undef REF_NR
