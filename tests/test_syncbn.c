/* test_syncbn.c — --sync-bn (syncbn.h): SyncBatchNorm's ops, and the stages that have it.
 *
 * What it promises, and how each test checks it:
 * - PyTorch's SyncBatchNorm on two ranks (tests/fixtures/syncbn.bin, made by
 *   tests/torch/syncbn_fixture.py): the same y, dx, running statistics and per-rank dγ, dβ.
 * - The ops: two ranks, each with half of a batch (two threads whose exchange is a real sum over
 *   both, through a barrier) — and three ranks, and ranks with unequal batches — normalise, update the
 *   running statistics and back-propagate as plain batch norm does on the whole batch; every rank
 *   gets the same statistics bit for bit, and their dγ, dβ add up to the whole batch's. On the CPU
 *   reference, and on the GPU for each kernel path (NCHW, the NHWC vector path, 16-bit with the
 *   fused ReLU). One rank's sync op is the plain op:
 *   to the bit on the GPU (the same kernels, a merge of one), to rounding on the CPU.
 * - End to end: stage 3 with R ranks at batch B and --sync-bn trains like stage 1 at batch R·B with
 *   batch norm (losses and final parameters to 1e-5), where without it the ranks' own statistics
 *   make the runs differ; stage 4 with accumulation likewise against one rank at R·B per
 *   micro-batch; stage 5 under fp16 autocast to 1e-3; one rank or --norm none is a note, not an
 *   error. Each sync run counts two exchanges per batch-norm layer and micro-step. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "errors.h"
#include "model.h"
#include "ops.h"
#include "ops_ref.h"
#include "report.h"
#include "tests.h"

#define LIMIT "timeout -k 5 300 "

/* ---- ranks in one process ---------------------------------------------------------------------- */

#define MAX_RANKS 3
typedef struct Pair { /* the ranks of one exchange (two, or up to MAX_RANKS) */
    pthread_barrier_t bar;
    int world;
    float *slot[MAX_RANKS];
} Pair;

typedef struct Rank {
    Pair *pair; /* NULL: one rank, nothing to add */
    Device *dev;
    int r;
} Rank;

/* BnSync.sum over the threads of a Pair: each copies its buffer out, all add the copies in rank
 * order, each copies the sum back (a real exchange, as the communicator's). */
static void pair_sum(void *ctx, float *buf, int64_t count) {
    Rank *k = ctx;
    if (!k->pair) return;
    Pair *p = k->pair;
    size_t bytes = (size_t)count * sizeof(float);
    float *mine = xmalloc(bytes), *sum = xmalloc(bytes);
    device_copy_d2h(k->dev, mine, buf, bytes);
    p->slot[k->r] = mine;
    pthread_barrier_wait(&p->bar);
    for (int64_t i = 0; i < count; i++) {
        sum[i] = p->slot[0][i];
        for (int r = 1; r < p->world; r++) sum[i] += p->slot[r][i];
    }
    pthread_barrier_wait(&p->bar); /* everyone has read every slot */
    device_copy_h2d(k->dev, buf, sum, bytes);
    device_sync(k->dev);
    free(mine), free(sum);
}

/* A batch-norm layer's inputs (logical NCHW fp32 values) and what one rank's passes gave back. */
typedef struct Case {
    DeviceKind kind;
    Precision p;
    int nhwc, relu, n, c, hw; /* n: this rank's images */
} Case;

typedef struct Out {
    float *y, *dx;                          /* n·c·hw, NCHW */
    float mean[64], invstd[64], rm[64], rv[64], dg[64], db[64];
} Out;

typedef struct Job {
    Case cs;
    const float *x, *dy, *gamma, *beta; /* this rank's images of x and dy; c values each */
    Pair *pair;
    int r, world, sync;
    Out out;
} Job;

/* fp32 NCHW host values → the device's tensor of c.p (16 bits on CUDA), NHWC when c.nhwc. */
static void *upload(Device *d, const Case *c, const float *src) {
    int64_t cnt = (int64_t)c->n * c->c * c->hw;
    float *t = xmalloc((size_t)cnt * sizeof(float));
    for (int i = 0; i < c->n; i++)
        for (int ch = 0; ch < c->c; ch++)
            for (int j = 0; j < c->hw; j++) {
                int64_t from = ((int64_t)i * c->c + ch) * c->hw + j;
                t[c->nhwc ? ((int64_t)i * c->hw + j) * c->c + ch : from] = precision_round(c->p, src[from]);
            }
    size_t esz = precision_bytes(d, c->p);
    void *dev = device_alloc(d, (size_t)cnt * esz, "test tensor");
    if (esz == 2) {
        uint16_t *h = xmalloc((size_t)cnt * 2);
        precision_pack(c->p, cnt, t, h);
        device_copy_h2d(d, dev, h, (size_t)cnt * 2);
        device_sync(d);
        free(h);
    } else {
        device_copy_h2d(d, dev, t, (size_t)cnt * sizeof(float));
        device_sync(d);
    }
    free(t);
    return dev;
}

static float *download(Device *d, const Case *c, const void *src) {
    int64_t cnt = (int64_t)c->n * c->c * c->hw;
    float *t = xmalloc((size_t)cnt * sizeof(float)), *out = xmalloc((size_t)cnt * sizeof(float));
    if (precision_bytes(d, c->p) == 2) {
        uint16_t *h = xmalloc((size_t)cnt * 2);
        device_copy_d2h(d, h, src, (size_t)cnt * 2);
        precision_unpack(c->p, cnt, h, t);
        free(h);
    } else {
        device_copy_d2h(d, t, src, (size_t)cnt * sizeof(float));
    }
    for (int i = 0; i < c->n; i++)
        for (int ch = 0; ch < c->c; ch++)
            for (int j = 0; j < c->hw; j++) {
                int64_t to = ((int64_t)i * c->c + ch) * c->hw + j;
                out[to] = t[c->nhwc ? ((int64_t)i * c->hw + j) * c->c + ch : to];
            }
    free(t);
    return out;
}

static float *dfloats(Device *d, const float *h, int n) {
    float *p = device_alloc(d, (size_t)n * sizeof(float), "test vector");
    device_copy_h2d(d, p, h, (size_t)n * sizeof(float));
    device_sync(d);
    return p;
}

/* One rank: forward (training) and backward of one batch-norm layer, synchronised or plain. */
static void *run_rank(void *arg) {
    Job *j = arg;
    const Case *c = &j->cs;
    Device d = {0};
    device_init(&d, c->kind, j->r, 0);
    device_bind(&d);
    const float zeros[64] = {0}, ones[64] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                             1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                             1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    void *x = upload(&d, c, j->x), *dy = upload(&d, c, j->dy);
    size_t bytes = (size_t)c->n * c->c * c->hw * precision_bytes(&d, c->p);
    void *y = device_alloc(&d, bytes, "test y"), *dx = device_alloc(&d, bytes, "test dx");
    float *g = dfloats(&d, j->gamma, c->c), *b = dfloats(&d, j->beta, c->c), *rm = dfloats(&d, zeros, c->c),
          *rv = dfloats(&d, ones, c->c), *sm = dfloats(&d, zeros, c->c), *si = dfloats(&d, zeros, c->c),
          *dg = dfloats(&d, zeros, c->c), *db = dfloats(&d, zeros, c->c);
    bn_prepare(&d, c->nhwc, c->n, c->c, c->hw);
    Rank k = {.pair = j->pair, .dev = &d, .r = j->r};
    BnSync s = {.sum = pair_sum, .ctx = &k, .rank = j->r, .world = j->world};
    if (j->sync) s.buf = device_alloc(&d, (size_t)j->world * 3 * c->c * sizeof(float), "test exchange");
    if (j->sync) {
        bn_forward_train_sync(&d, c->p, c->nhwc, c->n, c->c, c->hw, x, g, b, rm, rv, 0.1f, 1e-5f, sm, si, y, c->relu,
                              &s);
        bn_backward_sync(&d, c->p, c->nhwc, c->n, c->c, c->hw, x, y, dy, g, sm, si, 1e-5f, dx, dg, db, 0, c->relu, &s);
    } else {
        bn_forward_train_lp(&d, c->p, c->nhwc, c->n, c->c, c->hw, x, g, b, rm, rv, 0.1f, 1e-5f, sm, si, y, c->relu);
        bn_backward_lp(&d, c->p, c->nhwc, c->n, c->c, c->hw, x, y, dy, g, sm, si, 1e-5f, dx, dg, db, 0, c->relu);
    }
    j->out.y = download(&d, c, y);
    j->out.dx = download(&d, c, dx);
    size_t cb = (size_t)c->c * sizeof(float);
    device_copy_d2h(&d, j->out.mean, sm, cb), device_copy_d2h(&d, j->out.invstd, si, cb);
    device_copy_d2h(&d, j->out.rm, rm, cb), device_copy_d2h(&d, j->out.rv, rv, cb);
    device_copy_d2h(&d, j->out.dg, dg, cb), device_copy_d2h(&d, j->out.db, db, cb);
    void *all[] = {x, dy, y, dx, g, b, rm, rv, sm, si, dg, db, s.buf};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) device_free(&d, all[i]);
    device_destroy(&d);
    return NULL;
}

/* The inputs of a case: `total` images of c channels and hw positions, values with a mean of their
 * own per channel (so a rank's mean differs from the batch's). */
typedef struct Data {
    float *x, *dy, gamma[64], beta[64];
} Data;

static Data make_data(int total, int c, int hw, uint64_t seed) {
    Data t;
    int64_t cnt = (int64_t)total * c * hw;
    t.x = xmalloc((size_t)cnt * sizeof(float)), t.dy = xmalloc((size_t)cnt * sizeof(float));
    test_fill_uniform(t.x, cnt, seed, -1.0f, 1.0f);
    test_fill_uniform(t.dy, cnt, seed + 1, -1.0f, 1.0f);
    for (int i = total / 2; i < total; i++) /* the second half of the batch is shifted and wider */
        for (int64_t j = (int64_t)i * c * hw; j < (int64_t)(i + 1) * c * hw; j++) t.x[j] = 3.f * t.x[j] + 2.f;
    test_fill_uniform(t.gamma, c, seed + 2, 0.5f, 1.5f);
    test_fill_uniform(t.beta, c, seed + 3, -0.5f, 0.5f);
    return t;
}

/* world ranks (1 … MAX_RANKS) over the images of d, rank r holding ns[r] of them, in order (ns NULL:
 * c->n each). */
static void run_group(const Case *c, const Data *d, int world, const int *ns, int sync, Job *jobs) {
    Pair pair = {.world = world};
    ck_assert(world >= 1 && world <= MAX_RANKS);
    if (world > 1) pthread_barrier_init(&pair.bar, NULL, (unsigned)world);
    pthread_t th[MAX_RANKS];
    int64_t off = 0;
    for (int r = 0; r < world; r++) {
        Case mine = *c;
        if (ns) mine.n = ns[r];
        jobs[r] = (Job){.cs = mine, .x = d->x + off, .dy = d->dy + off, .gamma = d->gamma, .beta = d->beta,
                        .pair = world > 1 ? &pair : NULL, .r = r, .world = world, .sync = sync};
        off += (int64_t)mine.n * c->c * c->hw;
        ck_assert(pthread_create(&th[r], NULL, run_rank, &jobs[r]) == 0);
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    if (world > 1) pthread_barrier_destroy(&pair.bar);
}

/* world ranks of c->n images each (rank r: images [r·n, (r+1)·n)). */
static void run_ranks(const Case *c, const Data *d, int world, int sync, Job *jobs) {
    run_group(c, d, world, NULL, sync, jobs);
}

static void free_out(Out *o) { free(o->y), free(o->dx); }

/* world ranks holding ns[r] images each (unequal counts: PyTorch's SyncBatchNorm weighs each rank's
 * statistics by its count), with --sync-bn, against one device with all of them (plain batch norm):
 * every rank's y and dx within tol (relative to each tensor's largest value); the same statistics on
 * every rank, to the bit, and the whole batch's; dγ, dβ each rank's own, adding up to the whole
 * batch's. And the data can tell: rank 0's own statistics are not the whole batch's. */
static void check_group(Case c, int world, const int *ns, const char *what, double tol) {
    int total = 0;
    for (int r = 0; r < world; r++) total += ns[r];
    Data d = make_data(total, c.c, c.hw, 777);
    Job ranks[MAX_RANKS], one[1], own[1];
    run_group(&c, &d, world, ns, 1, ranks);
    Case whole = c, first = c;
    whole.n = total, first.n = ns[0];
    run_ranks(&whole, &d, 1, 0, one);
    run_ranks(&first, &d, 1, 0, own);
    const size_t cb = (size_t)c.c * sizeof(float);
    const double stat_tol = 2e-6;
    int64_t off = 0;
    float dg[64] = {0}, db[64] = {0};
    for (int r = 0; r < world; r++) {
        const Out *o = &ranks[r].out, *w = &one[0].out;
        int64_t cnt = (int64_t)ns[r] * c.c * c.hw;
        double ey = test_rel_err(o->y, w->y + off, cnt), edx = test_rel_err(o->dx, w->dx + off, cnt);
        ck_assert_msg(ey <= tol && edx <= tol, "%s: rank %d (%d images): y off by %.3g, dx by %.3g (tolerance %.3g)",
                      what, r, ns[r], ey, edx, tol);
        /* a 16-bit y and dx are stored as 16-bit values: the CPU emulation rounds them as the GPU stores them */
        for (int64_t i = 0; i < cnt; i++)
            ck_assert_msg(precision_round(c.p, o->y[i]) == o->y[i] && precision_round(c.p, o->dx[i]) == o->dx[i],
                          "%s: rank %d, element %lld: y %.9g or dx %.9g is no %s value", what, r, (long long)i,
                          (double)o->y[i], (double)o->dx[i], precision_name(c.p));
        ck_assert_msg(!memcmp(o->mean, ranks[0].out.mean, cb) && !memcmp(o->invstd, ranks[0].out.invstd, cb) &&
                          !memcmp(o->rm, ranks[0].out.rm, cb) && !memcmp(o->rv, ranks[0].out.rv, cb),
                      "%s: rank %d's statistics differ from rank 0's", what, r);
        for (int ch = 0; ch < c.c; ch++) dg[ch] += o->dg[ch], db[ch] += o->db[ch];
        off += cnt;
    }
    const Out *o = &ranks[0].out, *w = &one[0].out;
    ck_assert_msg(test_rel_err(o->mean, w->mean, c.c) <= stat_tol &&
                      test_rel_err(o->invstd, w->invstd, c.c) <= stat_tol &&
                      test_rel_err(o->rm, w->rm, c.c) <= stat_tol && test_rel_err(o->rv, w->rv, c.c) <= stat_tol,
                  "%s: statistics differ from the whole batch's", what);
    double eg = test_rel_err(dg, w->dg, c.c), eb = test_rel_err(db, w->db, c.c);
    ck_assert_msg(eg <= 1e-5 && eb <= 1e-5, "%s: summed over the ranks, dgamma off by %.3g, dbeta by %.3g", what, eg,
                  eb);
    ck_assert_msg(test_rel_err(o->dg, w->dg, c.c) > 1e-3, "%s: rank 0's dgamma is the whole batch's", what);
    ck_assert_msg(test_rel_err(own[0].out.mean, w->mean, c.c) > 1e-2, "%s: the test data cannot tell", what);
    for (int r = 0; r < world; r++) free_out(&ranks[r].out);
    free_out(&one[0].out), free_out(&own[0].out);
    free(d.x), free(d.dy);
}

/* Two ranks of c.n images each. */
static void check_two_ranks(Case c, const char *what, double tol) {
    check_group(c, 2, (const int[]){c.n, c.n}, what, tol);
}

/* One rank's sync op against the plain op: bitwise (exact = 1) or within 1e-6. */
static void check_one_rank(Case c, const char *what, int exact) {
    Data d = make_data(c.n, c.c, c.hw, 99);
    Job s[1], p[1];
    run_ranks(&c, &d, 1, 1, s);
    run_ranks(&c, &d, 1, 0, p);
    int64_t cnt = (int64_t)c.n * c.c * c.hw;
    size_t cb = (size_t)c.c * sizeof(float);
    const size_t tb = (size_t)cnt * sizeof(float);
    if (exact)
        ck_assert_msg(!memcmp(s[0].out.y, p[0].out.y, tb) && !memcmp(s[0].out.dx, p[0].out.dx, tb) &&
                          !memcmp(s[0].out.mean, p[0].out.mean, cb) && !memcmp(s[0].out.rv, p[0].out.rv, cb) &&
                          !memcmp(s[0].out.dg, p[0].out.dg, cb) && !memcmp(s[0].out.db, p[0].out.db, cb),
                      "%s: one rank's SyncBatchNorm is not the plain kernels' bits", what);
    else
        ck_assert_msg(test_rel_err(s[0].out.y, p[0].out.y, cnt) <= 1e-6 &&
                          test_rel_err(s[0].out.dx, p[0].out.dx, cnt) <= 1e-6 &&
                          test_rel_err(s[0].out.rv, p[0].out.rv, c.c) <= 1e-6,
                      "%s: one rank's SyncBatchNorm is not plain batch norm", what);
    free_out(&s[0].out), free_out(&p[0].out);
    free(d.x), free(d.dy);
}

START_TEST(sync_op_cpu) {
    check_two_ranks((Case){DEV_CPU, PREC_FP32, 0, 0, 3, 5, 7}, "CPU fp32", 1e-5);
    check_two_ranks((Case){DEV_CPU, PREC_FP32, 0, 1, 4, 8, 9}, "CPU fp32, fused ReLU", 1e-5);
    check_two_ranks((Case){DEV_CPU, PREC_BF16, 0, 1, 4, 8, 9}, "CPU bf16 (emulated), fused ReLU", 8e-3);
    check_one_rank((Case){DEV_CPU, PREC_FP32, 0, 0, 4, 6, 10}, "CPU fp32", 0);
    check_group((Case){DEV_CPU, PREC_FP32, 0, 0, 0, 6, 10}, 2, (const int[]){2, 5}, "CPU, 2 and 5 images", 1e-5);
    check_group((Case){DEV_CPU, PREC_FP32, 0, 1, 0, 6, 10}, 3, (const int[]){3, 1, 4}, "CPU, 3 ranks", 1e-5);
    /* a rank with no images (as PyTorch's SyncBatchNorm allows): its count of 0 weighs nothing, and
     * its mean (0/0) must not reach the others' statistics */
    check_group((Case){DEV_CPU, PREC_FP32, 0, 0, 0, 6, 10}, 3, (const int[]){3, 0, 4}, "CPU, a rank with none", 1e-5);
}
END_TEST

/* accumulate = 1 (a batch-norm input with a second consumer): the CPU sync op adds its dx to what dx
 * held, as plain batch norm's does (test_ops_ref's test_bn_backward_accumulate) — the gradient itself
 * is the one accumulate = 0 writes, so dx must be the prefill plus that, element by element; dγ, dβ
 * add onto theirs either way. One rank (nothing to exchange); with the fused ReLU and without. */
START_TEST(sync_op_cpu_accumulates) {
    enum { N = 3, C = 4, HW = 6, CNT = N * C * HW };
    Data d = make_data(N, C, HW, 31);
    for (int relu = 0; relu <= 1; relu++) {
        float rm[C] = {0}, rv[C] = {1, 1, 1, 1}, sm[C], si[C], y[CNT], buf[3 * C];
        float dx0[CNT], dg0[C] = {0}, db0[C] = {0}, dx[CNT], dg[C], db[C], pre[CNT], pre_g[C], pre_b[C];
        Rank k = {.pair = NULL};
        BnSync s = {.sum = pair_sum, .ctx = &k, .rank = 0, .world = 1, .buf = buf};
        ref_bn_forward_train_sync(PREC_FP32, N, C, HW, d.x, d.gamma, d.beta, rm, rv, 0.1f, 1e-5f, sm, si, y, relu, &s);
        ref_bn_backward_sync(PREC_FP32, N, C, HW, d.x, y, d.dy, d.gamma, sm, si, dx0, dg0, db0, 0, relu, &s);
        test_fill_uniform(pre, CNT, 41, -3.0f, 3.0f);
        test_fill_uniform(pre_g, C, 42, -3.0f, 3.0f);
        test_fill_uniform(pre_b, C, 43, -3.0f, 3.0f);
        memcpy(dx, pre, sizeof dx), memcpy(dg, pre_g, sizeof dg), memcpy(db, pre_b, sizeof db);
        ref_bn_backward_sync(PREC_FP32, N, C, HW, d.x, y, d.dy, d.gamma, sm, si, dx, dg, db, 1, relu, &s);
        for (int i = 0; i < CNT; i++)
            ck_assert_msg(dx[i] == pre[i] + dx0[i], "relu %d: dx[%d] = %.9g, want %.9g + %.9g", relu, i, (double)dx[i],
                          (double)pre[i], (double)dx0[i]);
        for (int ch = 0; ch < C; ch++)
            ck_assert_msg(fabs(dg[ch] - (pre_g[ch] + dg0[ch])) <= 1e-6 * (1 + fabs(dg0[ch])) &&
                              fabs(db[ch] - (pre_b[ch] + db0[ch])) <= 1e-6 * (1 + fabs(db0[ch])),
                          "relu %d: channel %d's dgamma/dbeta did not add onto what they held", relu, ch);
    }
    free(d.x), free(d.dy);
}
END_TEST

START_TEST(sync_op_cuda) {
    if (!test_have_gpu("SyncBatchNorm's kernels")) return;
    /* NCHW (the scalar kernels), NHWC fp32 and bf16 (the vector path: 4 | c), NHWC with c = 6 (scalar) */
    check_two_ranks((Case){DEV_CUDA, PREC_FP32, 0, 0, 4, 5, 49}, "CUDA fp32 NCHW", 1e-5);
    check_two_ranks((Case){DEV_CUDA, PREC_FP32, 1, 1, 8, 64, 16}, "CUDA fp32 NHWC vector, fused ReLU", 1e-5);
    check_two_ranks((Case){DEV_CUDA, PREC_FP32, 1, 0, 8, 6, 16}, "CUDA fp32 NHWC scalar", 1e-5);
    check_two_ranks((Case){DEV_CUDA, PREC_BF16, 1, 1, 8, 64, 16}, "CUDA bf16 NHWC vector, fused ReLU", 8e-3);
    check_two_ranks((Case){DEV_CUDA, PREC_FP16, 0, 0, 4, 5, 49}, "CUDA fp16 NCHW", 1e-3);
    check_one_rank((Case){DEV_CUDA, PREC_FP32, 0, 0, 4, 5, 49}, "CUDA fp32 NCHW", 1);
    check_group((Case){DEV_CUDA, PREC_FP32, 0, 0, 0, 5, 49}, 2, (const int[]){2, 5}, "CUDA NCHW, 2 and 5 images", 1e-5);
    check_group((Case){DEV_CUDA, PREC_FP32, 1, 1, 0, 64, 16}, 3, (const int[]){3, 1, 4}, "CUDA NHWC vector, 3 ranks",
                1e-5);
    check_one_rank((Case){DEV_CUDA, PREC_BF16, 1, 1, 8, 64, 16}, "CUDA bf16 NHWC vector", 1);
}
END_TEST

/* PyTorch's SyncBatchNorm: tests/fixtures/syncbn.bin holds what torch 2.11's batch_norm_stats,
 * batch_norm_gather_stats_with_counts, batch_norm_elemt, batch_norm_backward_reduce and
 * batch_norm_backward_elemt give two ranks (tests/torch/syncbn_fixture.py, the calls of
 * torch/nn/modules/_functions.py with the all_gather and all_reduce done in one process). Our two
 * ranks on the same inputs: y, dx, the running statistics and each rank's own dγ, dβ. */
static void check_against_torch(DeviceKind kind, int nhwc, const char *what) {
    Fx fx = fx_open("syncbn.bin", "tests/torch/syncbn_fixture.py");
    int64_t cnt;
    int dt;
    const int n = 3, c = 5, hw = 24;
    const int64_t per = (int64_t)n * c * hw;
    Data d;
    d.x = (float *)fx_get(&fx, "x", &cnt, &dt);
    ck_assert(cnt == 2 * per && dt == 0);
    d.dy = (float *)fx_get(&fx, "dy", &cnt, &dt);
    memcpy(d.gamma, fx_get(&fx, "weight", &cnt, &dt), (size_t)c * sizeof(float));
    memcpy(d.beta, fx_get(&fx, "bias", &cnt, &dt), (size_t)c * sizeof(float));
    const float *y = fx_get(&fx, "y", &cnt, &dt), *dx = fx_get(&fx, "dx", &cnt, &dt),
                *rm = fx_get(&fx, "running_mean", &cnt, &dt), *rv = fx_get(&fx, "running_var", &cnt, &dt),
                *gw = fx_get(&fx, "grad_weight", &cnt, &dt), *gb = fx_get(&fx, "grad_bias", &cnt, &dt);
    Case cs = {kind, PREC_FP32, nhwc, 0, n, c, hw};
    Job two[2];
    run_ranks(&cs, &d, 2, 1, two);
    for (int r = 0; r < 2; r++) {
        double ey = test_rel_err(two[r].out.y, y + r * per, per), edx = test_rel_err(two[r].out.dx, dx + r * per, per),
               erm = test_rel_err(two[r].out.rm, rm, c), erv = test_rel_err(two[r].out.rv, rv, c),
               eg = test_rel_err(two[r].out.dg, gw + r * c, c), eb = test_rel_err(two[r].out.db, gb + r * c, c);
        ck_assert_msg(ey <= 1e-5 && edx <= 1e-5 && erm <= 1e-6 && erv <= 1e-6 && eg <= 1e-5 && eb <= 1e-5,
                      "%s, rank %d against torch's SyncBatchNorm: y %.3g, dx %.3g, running mean %.3g, var %.3g, "
                      "dgamma %.3g, dbeta %.3g", what, r, ey, edx, erm, erv, eg, eb);
        free_out(&two[r].out);
    }
}

START_TEST(sync_op_matches_torch) {
    check_against_torch(DEV_CPU, 0, "CPU");
    if (!test_have_gpu("SyncBatchNorm's kernels against torch")) return;
    check_against_torch(DEV_CUDA, 0, "CUDA NCHW");
    check_against_torch(DEV_CUDA, 1, "CUDA NHWC");
}
END_TEST

/* ---- end to end -------------------------------------------------------------------------------- */


/* Largest relative difference of the step losses of two reports (n steps each). */
static double loss_diff(const char *a_path, const char *b_path, int n) {
    double a[64], b[64], worst = 0;
    ck_assert_int_eq(test_read_losses(a_path, a, 64), n);
    ck_assert_int_eq(test_read_losses(b_path, b, 64), n);
    for (int i = 0; i < n; i++) worst = test_max_nan(worst, fabs(a[i] - b[i]) / fabs(a[i]));
    return worst;
}

/* `ref` (a whole command but its --save and --report) against `ddp` with and without --sync-bn:
 * equal with it (losses and final parameters to tol), unequal without (losses apart by more than
 * contrast; 0: 10·tol). The sync run counts 2 exchanges per batch-norm layer (7 in tiny) and
 * micro-step. */
static void check_against(const char *ref, const char *ddp, const char *arch, int steps, double tol, double contrast,
                          const char *what) {
    char *dir = test_tmpdir(), cmd[4096], pa[600], pb[600];
    snprintf(cmd, sizeof cmd, LIMIT "%s --save %s/one --report %s/one.jsonl", ref, dir, dir);
    test_run_ok(cmd, what, NULL);
    snprintf(cmd, sizeof cmd, LIMIT "%s --sync-bn --master-port %d --save %s/sync --report %s/sync.jsonl", ddp,
             test_free_port(), dir, dir);
    char *out;
    test_run_ok(cmd, what, &out);
    ck_assert_msg(strstr(out, "SyncBatchNorm"), "%s: the header does not say SyncBatchNorm\n%s", what, out);
    /* rank 0 prints it, the others not: once however many ranks share the output (with 2 ranks, "rank 1
     * alone" also gives once — the 3-rank case tells them apart) */
    int headers = 0;
    for (const char *p = out; (p = strstr(p, "syncbn: SyncBatchNorm over ")); p++) headers++;
    ck_assert_msg(headers == 1, "%s: the header printed %d times\n%s", what, headers, out);
    snprintf(pa, sizeof pa, "%s/one.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/sync.jsonl", dir);
    double e = loss_diff(pa, pb, steps), e_sync = e;
    ck_assert_msg(e <= tol, "%s: --sync-bn losses differ by %.3g from one device's", what, e);
    double ex = test_report_field(pb, "comm_summary", "syncbn_exchanges"),
           micro = test_report_field(pb, "comm_summary", "micro_steps");
    ck_assert_msg(ex == micro * 2 * 7 && micro >= steps, "%s: %g exchanges in %g micro-steps (tiny: 14 each)", what, ex,
                  micro);
    /* and the header's figures per micro-step are what the exchanges then are and carry (one all-reduce
     * per layer each way; world × 3 floats per channel) */
    char want[96], b[32];
    snprintf(want, sizeof want, "— %.0f small all-reduces (%s) per micro-step", ex / micro,
             fmt_bytes(b, sizeof b, test_report_field(pb, "comm_summary", "syncbn_bytes") / micro));
    ck_assert_msg(strstr(out, want), "%s: the header does not say '%s'\n%s", what, want, out);
    free(out);
    snprintf(pa, sizeof pa, "%s/one/step%08d.ckpt", dir, steps);
    snprintf(pb, sizeof pb, "%s/sync/step%08d.ckpt", dir, steps);
    float *p1 = test_load_params(pa, arch, 1), *p2 = test_load_params(pb, arch, 1);
    double ep = test_rel_err(p2, p1, test_n_params_norm(arch, 1));
    ck_assert_msg(ep <= tol, "%s: --sync-bn final parameters differ by %.3g", what, ep);
    free(p1), free(p2);
    /* without --sync-bn each rank normalises over its own batch: not one device's training */
    snprintf(cmd, sizeof cmd, LIMIT "%s --master-port %d --report %s/own.jsonl", ddp, test_free_port(), dir);
    test_run_ok(cmd, what, NULL);
    snprintf(pa, sizeof pa, "%s/one.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/own.jsonl", dir);
    e = loss_diff(pa, pb, steps);
    printf("syncbn: %s: step losses against one device's: %.2g with --sync-bn, %.2g without\n", what, e_sync, e);
    ck_assert_msg(e > (contrast > 0 ? contrast : 10 * tol), "%s: without --sync-bn the losses still agree (%.3g): the "
                  "test cannot tell", what, e);
    free(dir);
}

#define TINY_BN "--device cpu --model tiny --norm bn --deterministic --progress off --log-every 1 --workers 1 " \
                "--test-size 64 --epochs 1 --lr 0.05"

START_TEST(sync_bn_stage3_matches_one_device) {
    char ref[1024], ddp[1024];
    snprintf(ref, sizeof ref, "%s/stage1 " TINY_BN " --train-size 256 --batch-size 32 --steps 6", test_root());
    snprintf(ddp, sizeof ddp, "%s/stage3 " TINY_BN " --train-size 256 --batch-size 16 --steps 6 --nproc-per-node 2",
             test_root());
    check_against(ref, ddp, "tiny", 6, 1e-5, 0, "stage 3, 2 ranks");
    /* the DDP paths that read each bucket's own all-reduce id, with exchanges between the buckets */
    char ddp2[1200];
    snprintf(ddp2, sizeof ddp2, "%s --bucket-mb 0.01 --optimizer-overlap after-backward", ddp);
    check_against(ref, ddp2, "tiny", 6, 1e-5, 0, "stage 3, 2 ranks, small buckets, optimizer after backward");
    snprintf(ddp2, sizeof ddp2, "%s --bucket-mb 0.01 --optimizer-overlap in-backward --broadcast-buffers after-forward",
             ddp);
    check_against(ref, ddp2, "tiny", 6, 1e-5, 0, "stage 3, 2 ranks, optimizer in backward, buffers after forward");
    snprintf(ref, sizeof ref, "%s/stage1 " TINY_BN " --train-size 288 --batch-size 48 --steps 5", test_root());
    snprintf(ddp, sizeof ddp,
             "%s/stage3 " TINY_BN " --train-size 288 --batch-size 16 --steps 5 --nproc-per-node 3 --bucket-mb 0.01",
             test_root());
    check_against(ref, ddp, "tiny", 5, 1e-5, 0, "stage 3, 3 ranks, small buckets");
}
END_TEST

/* Accumulation: batch norm works per micro-batch, so the reference is one rank whose micro-batch
 * is the R ranks' together. */
START_TEST(sync_bn_stage4_matches_one_rank) {
    char ref[1024], ddp[1024];
    snprintf(ref, sizeof ref,
             "%s/stage4 " TINY_BN " --train-size 256 --batch-size 32 --accum-steps 2 --steps 3 --nproc-per-node 1 "
             "--master-port %d", test_root(), test_free_port());
    snprintf(ddp, sizeof ddp,
             "%s/stage4 " TINY_BN " --train-size 256 --batch-size 16 --accum-steps 2 --steps 3 --nproc-per-node 2",
             test_root());
    check_against(ref, ddp, "tiny", 3, 1e-5, 0, "stage 4, 2 ranks × 2 micro-batches");
}
END_TEST

START_TEST(sync_bn_stage5_and_notes) {
    char *dir = test_tmpdir(), cmd[2048], ref[1024], ddp[1024], *out;
    /* autocast: fp16 activations round where the statistics differ by a last bit, so the match is
     * looser than fp32's (measured: 1.4e-4 with --sync-bn, 3.8e-3 without) */
    snprintf(ref, sizeof ref,
             "%s/stage5 " TINY_BN " --train-size 256 --batch-size 32 --steps 6 --amp fp16 --nproc-per-node 1 "
             "--master-port %d", test_root(), test_free_port());
    snprintf(ddp, sizeof ddp, "%s/stage5 " TINY_BN " --train-size 256 --batch-size 16 --steps 6 --amp fp16 "
             "--nproc-per-node 2", test_root());
    check_against(ref, ddp, "tiny", 6, 1e-3, 2e-3, "stage 5 fp16, 2 ranks");
    /* nothing to synchronise: a note, and plain batch norm */
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 " TINY_BN " --train-size 256 --steps 2 --nproc-per-node 1 --sync-bn "
             "--master-port %d", test_root(), test_free_port());
    test_run_ok(cmd, "one rank", &out);
    ck_assert_msg(strstr(out, "note: --sync-bn changes nothing here: one rank") && !strstr(out, ", SyncBatchNorm)"),
                  "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 --device cpu --model tiny --norm none --train-size 256 --test-size 64 "
             "--steps 2 --progress off --nproc-per-node 2 --sync-bn --master-port %d", test_root(), test_free_port());
    test_run_ok(cmd, "--norm none", &out);
    ck_assert_msg(strstr(out, "note: --sync-bn changes nothing here: the model has no batch norm"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* Two workers sharing the GPU (--comm host): the CUDA kernels' exchange inside a real job; and
 * with two GPUs, over NCCL. */
#define GPU_BN "--device cuda --model tiny --norm bn --deterministic --no-tf32 --progress off --log-every 1 " \
               "--test-size 64 --epochs 1 --lr 0.05 --train-size 512"

START_TEST(sync_bn_gpu_matches_one_gpu) {
    if (!test_have_gpu("--sync-bn on a GPU")) return;
    char ref[1024], ddp[1024];
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    snprintf(ref, sizeof ref, "%s/stage1 " GPU_BN " --batch-size 32 --steps 6", test_root());
    snprintf(ddp, sizeof ddp, "%s/stage3 " GPU_BN " --batch-size 16 --steps 6 --nproc-per-node 2 --comm host",
             test_root());
    check_against(ref, ddp, "tiny", 6, 1e-5, 0, "stage 3, 2 workers sharing GPU 0");
    unsetenv("CUDA_VISIBLE_DEVICES");
    if (device_cuda_count() < 2) {
        printf("SKIP: --sync-bn over NCCL — needs 2 GPUs, %d visible (the --comm host run covers the kernels)\n",
               device_cuda_count());
        return;
    }
    snprintf(ddp, sizeof ddp, "%s/stage3 " GPU_BN " --batch-size 16 --steps 6 --nproc-per-node 2 --comm nccl",
             test_root());
    check_against(ref, ddp, "tiny", 6, 1e-5, 0, "stage 3, 2 GPUs, NCCL");
}
END_TEST

Suite *suite_syncbn(void) {
    Suite *s = suite_create("syncbn");
    /* The op checks alone (CK_RUN_CASE=ops): what `make gpu-sanitize` runs under compute-sanitizer. */
    TCase *ops = tcase_create("ops");
    tcase_set_timeout(ops, 600);
    tcase_add_test(ops, sync_op_cpu);
    tcase_add_test(ops, sync_op_cpu_accumulates);
    tcase_add_test(ops, sync_op_cuda);
    tcase_add_test(ops, sync_op_matches_torch);
    suite_add_tcase(s, ops);
    TCase *tc = tcase_create("stages");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, sync_bn_stage3_matches_one_device);
    tcase_add_test(tc, sync_bn_stage4_matches_one_rank);
    tcase_add_test(tc, sync_bn_stage5_and_notes);
    tcase_add_test(tc, sync_bn_gpu_matches_one_gpu);
    suite_add_tcase(s, tc);
    return s;
}
