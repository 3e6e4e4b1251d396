/* test_ddp.c — stage 3's reducer and its end-to-end promise: R ranks × batch B train exactly like one
 * device with batch R·B (BN-free, so the batch split cannot matter), with and without overlap, with
 * many buckets and with one. On the CPU here; on GPUs (NCCL, and --comm host with two workers on
 * one GPU) when they are visible.
 *
 * Why the comparison is possible at all: stage 1's batch k is positions [kRB, (k+1)RB) of the epoch's
 * permutation; DistributedSampler gives rank r positions r, r+R, r+2R, …, so rank r's batch k is
 * positions kRB + r + jR (j < B) — not a slice of stage 1's batch, but together the R ranks' batch k
 * hold exactly stage 1's batch k (when R divides N, so nothing is padded). The mean loss over them
 * is the mean of the ranks' means, and the averaged gradient is the gradient of that mean.
 * sharded_batches_union_is_global_batch checks that claim; the runs check the rest.
 *
 * And the pitfall of a parameter the forward never uses (--unused-param): harmless without DDP, the
 * job stopped at the next step without --find-unused-parameters, training as one device with it —
 * each against what torch does (tests/fixtures/ddp_unused.txt). And, with two ranks in two processes,
 * the fp16 compression hook's arithmetic and which rank the buffers come from, against PyTorch's. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "comm.h"
#include "ddp.h"
#include "device.h"
#include "errors.h"
#include "loader.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "sampler.h"
#include "store.h"

#include "tests.h"

#define LIMIT "timeout -k 5 300 "

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* ---- the data order ---------------------------------------------------------------------------- */

START_TEST(sharded_batches_union_is_global_batch) {
    struct { int64_t n; int world, batch; } cases[] = {{256, 2, 16}, {288, 3, 16}, {1000, 4, 25}, {1000, 4, 7}, {90, 5, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t n = cases[c].n, R = cases[c].world, B = cases[c].batch, shard = n / R;
        ck_assert_int_eq(sampler_num_samples(n, (int)R, 0), shard); /* R | N: no padding */
        int64_t *order = malloc((size_t)n * sizeof(int64_t)), *idx = malloc((size_t)(R * shard) * sizeof(int64_t));
        int64_t *a = malloc((size_t)(R * B) * sizeof(int64_t)), *b = malloc((size_t)(R * B) * sizeof(int64_t));
        for (int64_t epoch = 0; epoch < 3; epoch++) {
            loader_epoch_order(n, 7, epoch, 1, order); /* stage 1, --seed 7 */
            for (int r = 0; r < R; r++) sampler_indices(n, (int)R, r, 7, epoch, 1, 0, idx + r * shard);
            int64_t batches = (n + R * B - 1) / (R * B);
            ck_assert_int_eq(batches, (shard + B - 1) / B); /* the same number of steps */
            for (int64_t k = 0; k < batches; k++) {
                int64_t na = 0, nb = 0;
                for (int64_t i = k * R * B; i < n && i < (k + 1) * R * B; i++) a[na++] = order[i];
                for (int r = 0; r < R; r++)
                    for (int64_t i = k * B; i < shard && i < (k + 1) * B; i++) b[nb++] = idx[r * shard + i];
                ck_assert_int_eq(na, nb);
                qsort(a, (size_t)na, sizeof *a, cmp_i64);
                qsort(b, (size_t)nb, sizeof *b, cmp_i64);
                ck_assert_msg(!memcmp(a, b, (size_t)na * sizeof *a), "N %lld R %lld B %lld epoch %lld batch %lld differs",
                              (long long)n, (long long)R, (long long)B, (long long)epoch, (long long)k);
            }
        }
        free(order), free(idx), free(a), free(b);
    }
}
END_TEST

/* ---- the bucket plans (one rank, in process) ----------------------------------------------------- */

typedef struct OneRank {
    Device dev;
    Store *store;
    Comm *comm;
    TrainConfig cfg;
    Run run;
    Model *m;
} OneRank;

static void one_rank_open(OneRank *o, const char *arch) {
    memset(o, 0, sizeof *o);
    device_init(&o->dev, DEV_CPU, 0, 0);
    setenv("STAGE_RDZV_SECRET", TEST_SECRET, 1);
    o->store = store_open("127.0.0.1", test_free_port(), 0, 1, 10);
    o->comm = comm_create(COMM_HOST, o->store, &o->dev, 10);
    config_defaults(&o->cfg);
    o->m = model_create(&o->dev, arch, 1, 1, 0);
    o->run = (Run){.cfg = &o->cfg, .world_size = 1, .rank = 0, .model = o->m};
    report_open(&o->run.report, "", "off", 0);
}

static void one_rank_close(OneRank *o) {
    model_destroy(o->m);
    comm_destroy(o->comm);
    store_close(o->store);
    device_destroy(&o->dev);
}

/* The order model_backward announces gradients in: layers in reverse, weight then bias. */
static int ready_order(const Model *m, int *order) {
    int n = 0;
    for (int l = m->n_layers - 1; l >= 0; l--) {
        if (m->layers[l].p0 >= 0) order[n++] = m->layers[l].p0;
        if (m->layers[l].p1 >= 0) order[n++] = m->layers[l].p1;
    }
    return n;
}

/* Buckets are contiguous slices that tile the gradient buffer, each closed by PyTorch's rule — but
 * with last_limit (--last-bucket-mb), the last is the shortest contiguous tail holding that much. */
/* One step whose gradients arrive in `order` (backward's), then the next forward: the step that
 * rebuilds the buckets in that order. */
static void step_then_rebuild(Ddp *d, Model *m, const int *order, int n) {
    model_zero_grad(m);
    ddp_forward_begin(d);
    for (int i = 0; i < n; i++) ddp_grad_ready(d, order[i]);
    ddp_backward_end(d);
    ddp_forward_begin(d);
    ck_assert(d->rebuilt);
}

static void check_plan_tail(const Ddp *d, const int *order, size_t first_limit, size_t limit, size_t last_limit) {
    const Model *m = d->m;
    int64_t covered = 0;
    int i = 0;
    int head = d->n_buckets - (last_limit ? 1 : 0); /* buckets closed by PyTorch's rule */
    if (last_limit) { /* the tail: big enough, contiguous, and no shorter tail is both */
        const DdpBucket *k = &d->buckets[d->n_buckets - 1];
        ck_assert_msg((size_t)k->count * 4 >= last_limit, "last bucket %lld bytes < %zu", (long long)k->count * 4,
                      last_limit);
        int64_t sum = 0, lo = INT64_MAX, hi = 0;
        for (int j = m->n_params - 1; j > m->n_params - k->n_params; j--) {
            const Param *p = &m->params[order[j]];
            sum += p->count;
            if (p->offset < lo) lo = p->offset;
            if (p->offset + p->count > hi) hi = p->offset + p->count;
            ck_assert_msg((size_t)sum * 4 < last_limit || hi - lo != sum, "the last bucket should start at %s", p->name);
        }
    }
    for (int b = 0; b < d->n_buckets; b++) {
        const DdpBucket *k = &d->buckets[b];
        covered += k->count;
        /* its parameters are the next ones in `order`, and exactly fill the slice */
        int64_t sum = 0, lo = INT64_MAX, hi = 0;
        size_t lim = b == 0 ? first_limit : limit, bytes = (size_t)k->count * 4;
        if (b == head) lim = SIZE_MAX; /* the tail: checked above */
        for (int j = 0; j < k->n_params; j++, i++) {
            const Param *p = &m->params[order[i]];
            ck_assert_msg(p->offset >= k->offset && p->offset + p->count <= k->offset + k->count,
                          "bucket %d: parameter %s lies outside its slice", b, p->name);
            ck_assert_int_eq(d->bucket_of[order[i]], b);
            /* not closed late: no shorter prefix was both big enough and contiguous */
            ck_assert_msg(j == 0 || (size_t)sum * 4 < lim || hi - lo != sum, "bucket %d should have closed before %s",
                          b, p->name);
            sum += p->count;
            if (p->offset < lo) lo = p->offset;
            if (p->offset + p->count > hi) hi = p->offset + p->count;
        }
        ck_assert_int_eq(sum, k->count);
        if (b < head - 1) ck_assert_msg(bytes >= lim, "bucket %d closed early: %zu < %zu bytes", b, bytes, lim);
    }
    ck_assert_int_eq(i, m->n_params);
    ck_assert_int_eq(covered, m->n_param_floats);
}

static void check_plan(const Ddp *d, const int *order, size_t first_limit, size_t limit) {
    check_plan_tail(d, order, first_limit, limit, 0);
}

/* One rank with ResNet-18, its gradient-ready order and the reverse parameter order; returns n_params. */
static int open_resnet18_orders(OneRank *o, int *order, int *reverse) {
    one_rank_open(o, "resnet18");
    int n = ready_order(o->m, order);
    ck_assert_int_eq(n, o->m->n_params);
    for (int i = 0; i < n; i++) reverse[i] = n - 1 - i;
    return n;
}

START_TEST(buckets_reverse_then_rebuilt_in_ready_order) {
    OneRank o;
    int order[512] = {0}, reverse[512] = {0};
    int n = open_resnet18_orders(&o, order, reverse);
    Model *m = o.m;
    size_t cap = 4 << 20;
    Ddp d;
    DdpFlags f;
    free(ddp_options(&f, NULL));
    f.bucket_mb = 4.0, f.bucket_mb_given = 1;
    ddp_init(&d, &o.run, o.comm, &f);
    check_plan(&d, reverse, cap, cap);
    int before = d.n_buckets;
    ck_assert_int_ge(before, 6); /* 44.7 MB of ResNet-18 in 4 MiB buckets (some 9 MiB convs alone) */
    /* Step 1: announce the gradients in backward's order; each bucket is all-reduced as soon as its
     * last gradient arrives and the ones before it have gone — never out of index order. */
    model_zero_grad(m);
    ddp_forward_begin(&d);
    int launched_before = 0;
    for (int i = 0; i < n; i++) {
        ddp_grad_ready(&d, order[i]);
        int expect = 0; /* buckets whose every parameter, and every earlier bucket's, is ready */
        while (expect < d.n_buckets && d.buckets[expect].pending == 0) expect++;
        ck_assert_int_eq(d.next, expect);
        ck_assert_int_ge(d.next, launched_before);
        launched_before = d.next;
    }
    ck_assert_int_eq(d.next, d.n_buckets);
    ddp_backward_end(&d);
    /* Step 2 rebuilds in that order. A cap of the user's own caps the first bucket too (torch:
     * bucket_cap_mb given, so not bucket_bytes_cap_default). */
    ddp_forward_begin(&d);
    ck_assert(d.rebuilt);
    check_plan(&d, order, cap, cap);
    ddp_destroy(&d);
    /* With --bucket-mb left out, the rebuilt first bucket is closed at 1 MiB (torch:
     * _DEFAULT_FIRST_BUCKET_BYTES): the classifier, the last BN and the last conv (9 MiB). */
    f.bucket_mb = 25, f.bucket_mb_given = 0;
    ddp_init(&d, &o.run, o.comm, &f);
    step_then_rebuild(&d, m, order, n);
    check_plan(&d, order, (size_t)1 << 20, (size_t)25 << 20);
    ck_assert_int_eq(d.bucket_of[order[0]], 0);
    ck_assert_int_eq(d.buckets[0].n_params, 5);
    ddp_destroy(&d);
    one_rank_close(&o);
}
END_TEST

START_TEST(bucket_extremes) {
    OneRank o;
    one_rank_open(&o, "tiny");
    int reverse[512] = {0};
    for (int i = 0; i < o.m->n_params; i++) reverse[i] = o.m->n_params - 1 - i;
    Ddp d;
    DdpFlags f;
    free(ddp_options(&f, NULL));
    f.bucket_mb = 1e-6;
    ddp_init(&d, &o.run, o.comm, &f); /* every parameter its own bucket */
    ck_assert_int_eq(d.n_buckets, o.m->n_params);
    check_plan(&d, reverse, 4, 4);
    ddp_destroy(&d);
    f.bucket_mb = 1000;
    ddp_init(&d, &o.run, o.comm, &f); /* one bucket for everything */
    ck_assert_int_eq(d.n_buckets, 1);
    ddp_destroy(&d);
    one_rank_close(&o);
}
END_TEST

/* PyTorch's rule closes a bucket once it holds at least its cap (size >= bucket_size_limit): a cap of
 * exactly the first parameter's size gives that parameter a bucket of its own. */
START_TEST(bucket_closes_at_exactly_its_cap) {
    OneRank o;
    one_rank_open(&o, "tiny");
    Model *m = o.m;
    int reverse[512] = {0};
    for (int i = 0; i < m->n_params; i++) reverse[i] = m->n_params - 1 - i;
    const Param *first = &m->params[reverse[0]], *second = &m->params[reverse[1]];
    ck_assert_int_ne(first->count, second->count); /* else "exactly" would not be tested */
    Ddp d;
    DdpFlags f;
    free(ddp_options(&f, NULL));
    f.bucket_mb = (double)first->count * sizeof(float) / 1048576.0; /* exact: a power-of-two denominator */
    ddp_init(&d, &o.run, o.comm, &f);
    ck_assert_uint_eq(d.cap_bytes, (size_t)first->count * sizeof(float));
    ck_assert_msg(d.buckets[0].n_params == 1 && d.buckets[0].count == first->count,
                  "bucket 0 holds %d parameters (%lld floats): a bucket of exactly its cap (%s, %zu bytes) must close",
                  d.buckets[0].n_params, (long long)d.buckets[0].count, first->name, d.cap_bytes);
    check_plan(&d, reverse, d.cap_bytes, d.cap_bytes);
    ddp_destroy(&d);
    one_rank_close(&o);
}
END_TEST

/* --last-bucket-mb's tail holds at least its size (>=, as the cap): a size of exactly the last
 * parameter's in the order (the first one in the buffer) gives it a bucket of its own. And at least
 * one parameter is left to the other buckets: a size only the whole model holds (exactly its size)
 * leaves the plan PyTorch's. */
START_TEST(last_bucket_exact_and_too_large) {
    OneRank o;
    one_rank_open(&o, "tiny");
    Model *m = o.m;
    int reverse[512] = {0};
    for (int i = 0; i < m->n_params; i++) reverse[i] = m->n_params - 1 - i;
    const Param *last = &m->params[reverse[m->n_params - 1]];
    Ddp d;
    DdpFlags f;
    free(ddp_options(&f, NULL));
    f.last_bucket_mb = (double)last->count * sizeof(float) / 1048576.0; /* exact: a power-of-two denominator */
    ddp_init(&d, &o.run, o.comm, &f);
    ck_assert_uint_eq(d.last_bytes, (size_t)last->count * sizeof(float));
    const DdpBucket *tail = &d.buckets[d.n_buckets - 1];
    ck_assert_msg(tail->n_params == 1 && tail->count == last->count,
                  "the last bucket holds %d parameters (%lld floats): one of exactly --last-bucket-mb (%s, %zu bytes) "
                  "is the smallest", tail->n_params, (long long)tail->count, last->name, d.last_bytes);
    check_plan_tail(&d, reverse, d.cap_bytes, d.cap_bytes, d.last_bytes);
    ddp_destroy(&d);
    /* a size under one byte is still a size: the smallest tail (the last parameter alone), not 0 —
     * which means PyTorch's plan, and was what 1e-9 MiB truncated to */
    f.last_bucket_mb = 1e-9;
    ddp_init(&d, &o.run, o.comm, &f);
    ck_assert_msg(d.last_bytes == 1 && d.n_buckets == 2 && d.buckets[1].n_params == 1 &&
                      d.buckets[1].count == last->count,
                  "--last-bucket-mb 1e-9: %zu bytes, %d buckets", d.last_bytes, d.n_buckets);
    ddp_destroy(&d);
    f.bucket_mb = 1e-6; /* every parameter its own bucket, and a tail of the whole model: none short of all */
    f.last_bucket_mb = (double)m->n_param_floats * sizeof(float) / 1048576.0;
    ddp_init(&d, &o.run, o.comm, &f);
    ck_assert_msg(d.n_buckets == m->n_params, "%d buckets, want %d: a --last-bucket-mb only the whole model "
                  "holds leaves the plan as it was", d.n_buckets, m->n_params);
    check_plan(&d, reverse, 4, 4);
    ddp_destroy(&d);
    /* …and under --find-unused-parameters the plan is what it would be at 0, find_unused's (cut in
     * parameter order, then reversed), not the reverse-order plan the tail was sought in */
    Ddp z;
    f.bucket_mb = 0.05, f.find_unused = 1, f.last_bucket_mb = 0;
    ddp_init(&z, &o.run, o.comm, &f);
    f.last_bucket_mb = 100;
    ddp_init(&d, &o.run, o.comm, &f);
    ck_assert_msg(!d.last_cut && d.n_buckets == z.n_buckets, "%d buckets, want %d", d.n_buckets, z.n_buckets);
    for (int b = 0; b < d.n_buckets; b++)
        ck_assert_msg(d.buckets[b].offset == z.buckets[b].offset && d.buckets[b].count == z.buckets[b].count,
                      "bucket %d: offset %lld count %lld, want %lld %lld", b, (long long)d.buckets[b].offset,
                      (long long)d.buckets[b].count, (long long)z.buckets[b].offset, (long long)z.buckets[b].count);
    ddp_destroy(&d), ddp_destroy(&z);
    one_rank_close(&o);
}
END_TEST

/* A --last-bucket-mb no tail short of the whole order holds leaves the plan PyTorch's (above) — and
 * the console says so, with the size that fits, instead of "last the smallest ≥ 100.00 MiB" over a plan
 * without one; at the rebuild too, where the gradient-ready order's longest tail is shorter than the
 * reverse order's (tiny: fc.weight and fc.bias are reported first), instead of "last as before". */
START_TEST(last_bucket_too_large_is_said) {
    OneRank o;
    one_rank_open(&o, "tiny");
    const int64_t total = o.m->n_param_floats * (int64_t)sizeof(float);
    one_rank_close(&o);
    char cmd[1024], *out;
    const char *common = LIMIT "%s/stage3 --device cpu --model tiny --train-size 256 --test-size 64 --batch-size 16 "
                               "--steps 2 --progress off --nproc-per-node 2 --master-port %d --last-bucket-mb %.9g";
    snprintf(cmd, sizeof cmd, common, test_root(), test_free_port(), 100.0);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(!strstr(out, "last the smallest") && !strstr(out, "last as before") &&
                  strstr(out, "cap 25.00 MiB, no last bucket of its own)") &&
                  strstr(out, "ddp: note: --last-bucket-mb asks for 100.00 MiB, more than any tail of the reverse "
                              "parameter order holds") && strstr(out, "— give --last-bucket-mb 0.2"),
                  "%s", out);
    /* said once: the rebuild, whose plan has no last bucket either, says it only where the first plan had one */
    int notes = 0;
    for (const char *p = out; (p = strstr(p, "ddp: note: --last-bucket-mb asks for")); p++) notes++;
    ck_assert_msg(notes == 1, "the --last-bucket-mb note said %d times, want once:\n%s", notes, out);
    free(out);
    /* under --find-unused-parameters the plan falls back to PyTorch's (parameter order, reversed); the note
     * still gives the longest tail of the reverse order (all but fc.bias: 286.56 KiB), not "drop it" */
    snprintf(cmd, sizeof cmd, common, test_root(), test_free_port(), 100.0);
    strcat(cmd, " --find-unused-parameters");
    ck_assert_msg(test_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "(cut in parameter order, then reversed, first cap 1 MiB, cap 25.00 MiB, no last bucket "
                              "of its own)") &&
                  strstr(out, "— give --last-bucket-mb 0.2798 or less (at most 286.56 KiB here), or 0"),
                  "--find-unused-parameters: %s", out);
    free(out);
    /* 1 KiB short of the whole model: the reverse order's tail (all but fc.bias) holds it, the ready
     * order's (all but fc.weight and fc.bias) does not */
    snprintf(cmd, sizeof cmd, common, test_root(), test_free_port(), (double)(total - 1024) / 1048576.0);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "2 buckets: 40 B, ") && strstr(out, "last the smallest ≥") &&
                  strstr(out, "(first cap 1 MiB, no last bucket of its own): 1 bucket:") &&
                  !strstr(out, "last as before") &&
                  strstr(out, "ddp: note: --last-bucket-mb asks for ") &&
                  strstr(out, "more than any tail of the gradient-ready order holds") &&
                  /* its longest contiguous tail: all but fc.weight and fc.bias (with fc.bias, reported second,
                   * the tail skips fc.weight: not one slice of the buffer) */
                  strstr(out, "give --last-bucket-mb 0.2774 or less (at most 284.06 KiB here)"), "%s", out);
    free(out);
}
END_TEST

/* find_unused_parameters never rebuilds, so PyTorch plans as a rebuild would from the start: with the
 * default cap (25 MiB) the first bucket closes at 1 MiB (ResNet-18: not all in one 25 MiB bucket). */
START_TEST(find_unused_plans_first_bucket_at_1mib) {
    OneRank o;
    int order[512] = {0}, reverse[512] = {0}, forward[512] = {0};
    int n = open_resnet18_orders(&o, order, reverse);
    for (int i = 0; i < n; i++) forward[i] = i;
    Ddp d;
    DdpFlags f;
    free(ddp_options(&f, NULL));
    f.find_unused = 1;
    ddp_init(&d, &o.run, o.comm, &f);
    /* cut in forward order, the first at 1 MiB, then reversed: read backwards, PyTorch's rule holds */
    Ddp back = d;
    DdpBucket rev[64];
    ck_assert_int_le(d.n_buckets, 64);
    for (int b = 0; b < d.n_buckets; b++) rev[b] = d.buckets[d.n_buckets - 1 - b];
    back.buckets = rev;
    int *bucket_of = xmalloc((size_t)n * sizeof(int));
    for (int p = 0; p < n; p++) bucket_of[p] = d.n_buckets - 1 - d.bucket_of[p];
    back.bucket_of = bucket_of;
    for (int b = 0; b < d.n_buckets; b++) rev[b].n_params = d.buckets[d.n_buckets - 1 - b].n_params;
    check_plan(&back, forward, (size_t)1 << 20, (size_t)25 << 20);
    free(bucket_of);
    /* the small bucket, the first layers', is the last: all-reduced after every other */
    ck_assert_msg((size_t)d.buckets[d.n_buckets - 1].count * 4 < ((size_t)2 << 20), "last bucket %lld bytes",
                  (long long)d.buckets[d.n_buckets - 1].count * 4);
    ck_assert_int_eq(d.bucket_of[0], d.n_buckets - 1);
    ddp_destroy(&d);
    /* a --bucket-mb of the user's own: every bucket at that cap, the first too (PyTorch's rule) */
    f.bucket_mb = 4, f.bucket_mb_given = 1;
    ddp_init(&d, &o.run, o.comm, &f);
    ck_assert_int_eq(d.bucket_of[0], d.n_buckets - 1);
    ck_assert_uint_eq(d.first_bytes, d.cap_bytes);
    ddp_destroy(&d);
    one_rank_close(&o);
}
END_TEST

/* torch's buckets of one case of tests/fixtures/ddp_buckets.txt at step 2 (rebuilt; find_unused: as
 * constructed, and never changed), in floats, into out (at most 64); returns how many. */
static int torch_buckets(const char *name, int64_t *out) {
    char path[600], line[4096], want[64];
    snprintf(path, sizeof path, "%s/tests/fixtures/ddp_buckets.txt", test_root());
    FILE *fx = fopen(path, "r");
    ck_assert_msg(fx != NULL, "%s missing: python3 tests/torch/ddp_buckets_fixture.py writes it", path);
    snprintf(want, sizeof want, "case=%s step=2 buckets=", name);
    int nt = 0;
    while (fgets(line, sizeof line, fx))
        if (!strncmp(line, want, strlen(want)))
            for (char *q = line + strlen(want); *q && *q != '\n' && nt < 64; q += *q == ',')
                out[nt++] = strtoll(q, &q, 10);
    fclose(fx);
    ck_assert_msg(nt > 0, "%s: no line '%s'", path, want);
    return nt;
}

/* The buckets torch 2.11 builds for ResNet-18 (tests/fixtures/ddp_buckets.txt, made by
 * tests/torch/ddp_buckets_fixture.py): rebuilt after step 1 in gradient-ready order with bucket_cap_mb
 * left out, 25 given, 4 and 1000; and, under find_unused_parameters (never rebuilt), at construction
 * with bucket_cap_mb left out and 4. ddp.c's plans must be the same buckets, float for float, in the
 * same order. */
START_TEST(buckets_are_torchs) {
    static const struct { const char *name; int find_unused, given; double mb; } cases[] = {
        {"default", 0, 0, 25}, {"cap25", 0, 1, 25}, {"cap4", 0, 1, 4}, {"cap1000", 0, 1, 1000},
        {"unused_default", 1, 0, 25}, {"unused_cap4", 1, 1, 4}};
    OneRank o;
    int order[512] = {0}, reverse[512] = {0};
    int n = open_resnet18_orders(&o, order, reverse);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t torch[64];
        int nt = torch_buckets(cases[c].name, torch);
        Ddp d;
        DdpFlags f;
        free(ddp_options(&f, NULL));
        f.find_unused = cases[c].find_unused, f.bucket_mb = cases[c].mb, f.bucket_mb_given = cases[c].given;
        ddp_init(&d, &o.run, o.comm, &f);
        if (!cases[c].find_unused) step_then_rebuild(&d, o.m, order, n); /* step 1 in backward's order */
        char got[1024] = "", exp[1024] = "";
        for (int b = 0; b < d.n_buckets; b++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", b ? "," : "", (long long)d.buckets[b].count);
        for (int b = 0; b < nt; b++)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%s%lld", b ? "," : "", (long long)torch[b]);
        ck_assert_msg(!strcmp(got, exp), "%s: buckets of %s floats, torch's %s", cases[c].name, got, exp);
        ddp_destroy(&d);
    }
    one_rank_close(&o);
}
END_TEST

/* The same buckets from ./stage3's command line, where whether --bucket-mb was given is the parser's
 * to say (cli_given), not a flag a caller sets: two steps of ResNet-18 on the CPU, the run's final
 * buckets (comm_summary's bucket_bytes) against torch's — --bucket-mb left out, 25 (the default's
 * value, given), 4, and --find-unused-parameters. */
START_TEST(command_line_buckets_are_torchs) {
    static const struct { const char *name, *flags, *rebuilt; } cases[] = {
        {"default", "", "(first cap 1 MiB)"},
        {"cap25", "--bucket-mb 25", "(first cap = --bucket-mb"},
        {"cap4", "--bucket-mb 4", "(first cap = --bucket-mb"},
        {"unused_default", "--find-unused-parameters", "buckets never rebuilt"}};
    char *dir = test_tmpdir();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char cmd[2048], rep[700], *out = NULL;
        snprintf(rep, sizeof rep, "%s/%s.jsonl", dir, cases[c].name);
        snprintf(cmd, sizeof cmd,
                 LIMIT "%s/stage3 --device cpu --model resnet18 --nproc-per-node 1 --epochs 1 --steps 2 --batch-size 2 "
                       "--train-size 4 --test-size 2 --progress off %s --master-port %d --report %s",
                 test_root(), cases[c].flags, test_free_port(), rep);
        test_run_ok(cmd, cases[c].name, &out);
        ck_assert_msg(strstr(out, cases[c].rebuilt), "%s: no '%s':\n%s", cases[c].name, cases[c].rebuilt, out);
        free(out);
        int64_t torch[64];
        double got[64];
        int nt = torch_buckets(cases[c].name, torch), ng = test_report_list(rep, "comm_summary", "bucket_bytes", got, 64);
        char g[1024] = "", e[1024] = "";
        for (int b = 0; b < ng; b++) snprintf(g + strlen(g), sizeof g - strlen(g), "%s%.0f", b ? "," : "", got[b] / 4);
        for (int b = 0; b < nt; b++) snprintf(e + strlen(e), sizeof e - strlen(e), "%s%lld", b ? "," : "", (long long)torch[b]);
        ck_assert_msg(!strcmp(g, e), "./stage3 %s: buckets of %s floats, torch's %s", cases[c].flags, g, e);
    }
    free(dir);
}
END_TEST

/* --last-bucket-mb: the last bucket (all-reduced after backward, in the open) is the shortest tail of
 * the order that holds the given size, in the reverse plan and in the rebuilt one; the others are
 * planned by PyTorch's rule. ResNet-18's default last bucket is 8 MiB; with 1 MiB it is conv1 and
 * layer1 and a little more. */
START_TEST(small_last_bucket) {
    OneRank o;
    int order[512] = {0}, reverse[512] = {0};
    int n = open_resnet18_orders(&o, order, reverse);
    Model *m = o.m;
    Ddp d;
    DdpFlags f;
    free(ddp_options(&f, NULL));
    size_t cap = 25 << 20, last = 1 << 20;
    ddp_init(&d, &o.run, o.comm, &f);
    check_plan(&d, reverse, cap, cap);
    int64_t default_last = d.buckets[d.n_buckets - 1].count;
    ddp_destroy(&d);
    f.last_bucket_mb = 1.0;
    ddp_init(&d, &o.run, o.comm, &f);
    check_plan_tail(&d, reverse, cap, cap, last);
    model_zero_grad(m);
    ddp_forward_begin(&d);
    for (int i = 0; i < n; i++) ddp_grad_ready(&d, order[i]);
    ck_assert_int_eq(d.next, d.n_buckets); /* every bucket launched, the small last one too */
    ddp_backward_end(&d);
    ddp_forward_begin(&d); /* rebuilt in ready order: first at 1 MiB, last the smallest ≥ 1 MiB */
    ck_assert(d.rebuilt);
    check_plan_tail(&d, order, (size_t)1 << 20, cap, last);
    int64_t small = d.buckets[d.n_buckets - 1].count;
    ck_assert_msg(small * 4 < 2 * (1 << 20) && small * 4 < default_last * 4,
                  "last bucket %lld bytes (default plan: %lld)", (long long)small * 4, (long long)default_last * 4);
    ck_assert_int_eq(d.bucket_of[order[n - 1]], d.n_buckets - 1); /* conv1's weight: the last gradient */
    ddp_destroy(&d);
    /* The tail must be a slice of the buffer. In ready order the last three gradients are bn1.weight,
     * bn1.bias, conv1.weight, and conv1.weight + bn1.bias (not neighbours in the buffer) is no slice:
     * a size those two just hold takes bn1.weight too. */
    const Param *c1 = &m->params[order[n - 1]], *b1 = &m->params[order[n - 2]];
    ck_assert_msg(c1->offset + c1->count != b1->offset && b1->offset + b1->count != c1->offset,
                  "%s and %s are neighbours in the buffer: the case tests nothing", c1->name, b1->name);
    size_t two = (size_t)(c1->count + b1->count) * sizeof(float);
    f.last_bucket_mb = (double)two / 1048576.0; /* exact: a power-of-two denominator */
    ddp_init(&d, &o.run, o.comm, &f);
    step_then_rebuild(&d, m, order, n);
    check_plan_tail(&d, order, (size_t)1 << 20, cap, two);
    ck_assert_int_eq(d.buckets[d.n_buckets - 1].n_params, 3);
    ddp_destroy(&d);
    /* --find-unused-parameters keeps the tail last: the reverse plan with it (never rebuilt), not
     * PyTorch's forward-order plan, whose reversal would put the small bucket first */
    f.last_bucket_mb = 1.0, f.find_unused = 1;
    ddp_init(&d, &o.run, o.comm, &f);
    check_plan_tail(&d, reverse, cap, cap, last);
    ck_assert_int_eq(d.bucket_of[reverse[n - 1]], d.n_buckets - 1); /* conv1's weight */
    ddp_destroy(&d);
    one_rank_close(&o);
}
END_TEST

/* ---- DDP ≡ one device --------------------------------------------------------------------------- */

/* Parameters of a checkpoint of the given model (malloc'd). */
float *test_load_params(const char *path, const char *arch, int norm_bn) {
    Device cpu = {0};
    device_init(&cpu, DEV_CPU, 0, 0);
    Model *m = model_create(&cpu, arch, norm_bn, 1, 0);
    CheckpointMeta expect = {0}, got;
    snprintf(expect.arch, sizeof expect.arch, "%s", arch);
    snprintf(expect.norm, sizeof expect.norm, "%s", norm_bn ? "bn" : "none");
    expect.n_params = m->n_param_floats, expect.n_buffers = m->n_buffer_floats, expect.shape_hash = m->shape_hash;
    size_t pb = (size_t)m->n_param_floats * sizeof(float);
    float *p = malloc(pb), *mom = malloc(pb), *buf = malloc((size_t)(m->n_buffer_floats + 1) * sizeof(float));
    checkpoint_load(path, &expect, &got, p, buf, mom, NULL);
    free(mom), free(buf);
    model_destroy(m);
    device_destroy(&cpu);
    return p;
}

int64_t test_n_params(const char *arch) { return test_n_params_norm(arch, 0); }

int64_t test_n_params_norm(const char *arch, int norm_bn) {
    Device cpu = {0};
    device_init(&cpu, DEV_CPU, 0, 0);
    Model *m = model_create(&cpu, arch, norm_bn, 1, 0);
    int64_t n = m->n_param_floats;
    model_destroy(m);
    device_destroy(&cpu);
    return n;
}

/* Train `steps` steps of stage 1 at batch R·B and of stage 3 with R ranks at batch B (extra flags
 * for each), then compare every logged loss and the final parameters. */
static void check_equivalence_env(const char *env, const char *common, int world, int batch, int steps,
                                  const char *stage1_extra, const char *stage3_extra, const char *what) {
    char dir[] = "/tmp/ddp_XXXXXX", cmd[4096], *out;
    ck_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 %s %s --batch-size %d --steps %d --log-every 1 --save %s/one --report %s/one.jsonl",
             test_root(), common, stage1_extra, world * batch, steps, dir, dir);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s: stage1 failed:\n%s", what, out);
    free(out);
    snprintf(cmd, sizeof cmd,
             "%s " LIMIT "%s/stage3 %s %s --nproc-per-node %d --batch-size %d --steps %d --log-every 1 --master-port %d "
                   "--save %s/ddp --report %s/ddp.jsonl",
             env, test_root(), common, stage3_extra, world, batch, steps, test_free_port(), dir, dir);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s: stage3 failed:\n%s", what, out);
    free(out);
    double a[64], b[64];
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/one.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/ddp.jsonl", dir);
    ck_assert_int_eq(test_read_losses(pa, a, 64), steps);
    ck_assert_int_eq(test_read_losses(pb, b, 64), steps);
    for (int i = 0; i < steps; i++)
        ck_assert_msg(fabs(a[i] - b[i]) <= 1e-5 * fabs(a[i]), "%s: step %d loss %.9g (stage 1) vs %.9g (stage 3)", what,
                      i + 1, a[i], b[i]);
    snprintf(pa, sizeof pa, "%s/one/step%08d.ckpt", dir, steps);
    snprintf(pb, sizeof pb, "%s/ddp/step%08d.ckpt", dir, steps);
    const char *arch = strstr(common, "resnet18") ? "resnet18" : "tiny";
    float *pa_ = test_load_params(pa, arch, 0), *pb_ = test_load_params(pb, arch, 0);
    double err = test_rel_err(pb_, pa_, test_n_params(arch));
    ck_assert_msg(err <= 1e-5, "%s: final parameters differ by %.3g (relative)", what, err);
    free(pa_), free(pb_);
}

static void check_equivalence(const char *common, int world, int batch, int steps, const char *stage1_extra,
                              const char *stage3_extra, const char *what) {
    check_equivalence_env("", common, world, batch, steps, stage1_extra, stage3_extra, what);
}

#define CPU_EQ "--device cpu --model tiny --norm none --train-size %d --test-size 64 --epochs 1 --lr 0.05 --deterministic --progress off"

START_TEST(ddp_cpu_matches_one_device) {
    char common[512];
    snprintf(common, sizeof common, CPU_EQ, 256); /* 8 steps of 32 per epoch; 6 are run */
    check_equivalence(common, 2, 16, 6, "", "", "2 ranks, overlap, default buckets");
    check_equivalence(common, 2, 16, 6, "", "--no-overlap", "2 ranks, --no-overlap");
    check_equivalence(common, 2, 16, 6, "", "--bucket-mb 0.001", "2 ranks, one bucket per parameter");
    check_equivalence(common, 2, 16, 6, "", "--bucket-mb 1000", "2 ranks, one huge bucket");
    check_equivalence(common, 2, 16, 6, "", "--last-bucket-mb 0.002", "2 ranks, a small last bucket");
    snprintf(common, sizeof common, CPU_EQ, 288); /* 3 × 16 = 48 per step, 6 steps per epoch */
    check_equivalence(common, 3, 16, 5, "", "--bucket-mb 0.01", "3 ranks, small buckets");
    /* every rank builds the same model from --seed, so the start-up broadcast of rank 0's weights
     * copies what is there already: the other ranks start from other weights here (1.5×), and the
     * job must still train as one device does — only that broadcast can make it */
    check_equivalence_env("STAGE3_TEST_SKEW_INIT=1", common, 3, 16, 5, "", "", "3 ranks, ranks 1-2 start elsewhere");
}
END_TEST

/* Sharded evaluation (ddp_evaluate): DistributedSampler pads the test set to a multiple of R, and the
 * padding (repeats of the first samples) must not be scored — each rank counts only its real samples
 * (sampler_num_real). With 67 test samples, 2 and 3 ranks both pad; the sums they all-reduce must be
 * stage 1's over the whole set: the same accuracy (correct / 67) and loss. ddp_cpu_matches_one_device
 * compares training only, at a test set R divides, so it cannot tell. */
START_TEST(sharded_evaluation_scores_each_test_sample_once) {
    char *dir = test_tmpdir(), cmd[4096], rep[600], *out;
    const char *common = "--device cpu --model tiny --test-size 67 --deterministic --progress off";
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 %s --train-size 32 --batch-size 16 --epochs 1 --save %s/a --report "
             "%s/one.jsonl", test_root(), common, dir, dir);
    ck_assert_msg(test_run(cmd, &out) == 0, "stage1 failed:\n%s", out);
    free(out);
    snprintf(rep, sizeof rep, "%s/one.jsonl", dir);
    double acc = test_report_field(rep, "epoch", "test_acc"), loss = test_report_field(rep, "epoch", "test_loss");
    ck_assert_msg(acc > 0 && loss > 0, "no test result in %s", rep);
    for (int world = 2; world <= 3; world++) {
        snprintf(rep, sizeof rep, "%s/ddp%d.jsonl", dir, world);
        snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 %s --nproc-per-node %d --master-port %d --evaluate --resume "
                 "%s/a/epoch001.ckpt --report %s", test_root(), common, world, test_free_port(), dir, rep);
        ck_assert_msg(test_run(cmd, &out) == 0, "stage3, %d ranks, failed:\n%s", world, out);
        free(out);
        double a = test_report_field(rep, "evaluate", "test_acc"), l = test_report_field(rep, "evaluate", "test_loss");
        ck_assert_msg(a == acc && fabs(l - loss) <= 1e-5 * loss, "%d ranks on 67 test samples: acc %.9g loss %.9g, "
                      "one device's %.9g %.9g (padding scored?)", world, a, l, acc, loss);
    }
    free(dir);
}
END_TEST

/* BN's running statistics are buffers each rank updates from its own batches; DDP broadcasts rank 0's
 * before every synchronised forward and before evaluation, so every rank scores its shard with the
 * buffers rank 0 saves. The epoch's test result of a --norm bn stage 3 run must then be a one-device
 * evaluation of its checkpoint: without the broadcast, rank 1 scores with buffers of its own. */
START_TEST(evaluation_uses_rank_0s_broadcast_buffers) {
    char *dir = test_tmpdir(), cmd[4096], rep[600], *out;
    const char *common = "--device cpu --model tiny --norm bn --test-size 64 --deterministic --progress off";
    snprintf(rep, sizeof rep, "%s/ddp.jsonl", dir);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 %s --nproc-per-node 2 --train-size 64 --batch-size 8 --epochs 1 "
             "--master-port %d --save %s/s3 --report %s", test_root(), common, test_free_port(), dir, rep);
    ck_assert_msg(test_run(cmd, &out) == 0, "stage3 failed:\n%s", out);
    free(out);
    double acc = test_report_field(rep, "epoch", "test_acc"), loss = test_report_field(rep, "epoch", "test_loss");
    ck_assert_msg(acc > 0 && loss > 0, "no test result in %s", rep);
    snprintf(rep, sizeof rep, "%s/one.jsonl", dir);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 %s --evaluate --resume %s/s3/epoch001.ckpt --report %s", test_root(),
             common, dir, rep);
    ck_assert_msg(test_run(cmd, &out) == 0, "stage1 --evaluate failed:\n%s", out);
    free(out);
    double a = test_report_field(rep, "evaluate", "test_acc"), l = test_report_field(rep, "evaluate", "test_loss");
    ck_assert_msg(a == acc && fabs(l - loss) <= 1e-5 * loss, "stage 3's epoch test: acc %.9g loss %.9g; one device "
                  "evaluating its checkpoint: %.9g %.9g (buffers not rank 0's?)", acc, loss, a, l);
    free(dir);
}
END_TEST

/* The summary's per-rank line: each rank's forward + backward and its waits, side by side (the
 * averages hide which rank was late). Two CPU workers: one value per rank, each a real duration
 * inside the step; one worker: no such line, one value in the JSON. */
START_TEST(per_rank_times_are_reported) {
    char dir[] = "/tmp/ddp_XXXXXX", cmd[1024], path[600], *out;
    ck_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage3 --device cpu --model tiny --train-size 640 --test-size 64 --batch-size 16 --steps 20 "
                   "--epochs 1 --progress off --nproc-per-node 2 --master-port %d --report %s",
             test_root(), test_free_port(), path);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "per rank, ms (rank 0 … 1): forward+backward "), "%s", out);
    /* the comm line's bandwidth is the JSON's, to as many digits as it needs: on the CPU's TCP ring a tiny
     * model moves hundredths of a GB/s, which one decimal printed as a broken-looking "0.0 GB/s" */
    const char *bw = strstr(out, "comm over the run: ");
    bw = bw ? strstr(bw, "algbw ") : NULL;
    ck_assert_msg(bw, "%s", out);
    const double printed = atof(bw + 6), json_bw = test_report_field(path, "comm_summary", "algbw_gbps");
    ck_assert_msg(printed > 0 && fabs(printed - json_bw) <= 0.0005 + 0.05 * json_bw, "printed %s, JSON %.6g", bw,
                  json_bw);
    free(out);
    double fb[4], ex[4], bc[4], step[1];
    ck_assert_int_eq(test_report_list(path, "comm_per_rank", "fwd_bwd_ms_per_rank", fb, 4), 2);
    ck_assert_int_eq(test_report_list(path, "comm_per_rank", "exposed_backward_ms_per_rank", ex, 4), 2);
    ck_assert_int_eq(test_report_list(path, "comm_per_rank", "bcast_ms_per_rank", bc, 4), 2);
    long len;
    char *text = test_slurp(path, &len), *sum = strstr(text, "\"type\":\"summary\"");
    ck_assert(sum && strstr(sum, "\"ms_per_iter_median\":"));
    step[0] = atof(strstr(sum, "\"ms_per_iter_median\":") + 21);
    free(text);
    for (int r = 0; r < 2; r++) {
        /* forward + backward is most of a CPU step, never more than it (10% for the medians' spread) */
        ck_assert_msg(fb[r] > 0.3 * step[0] && fb[r] < 1.1 * step[0], "rank %d: forward+backward %.3f ms, step %.3f ms",
                      r, fb[r], step[0]);
        ck_assert_msg(ex[r] >= 0 && ex[r] < step[0] && bc[r] >= 0 && bc[r] < step[0], "rank %d: waits %.3f, %.3f ms", r,
                      ex[r], bc[r]);
    }
    /* the run's comm summary is those medians averaged over the ranks (not summed: a mutation audit) */
    double ex_all = test_report_field(path, "comm_summary", "exposed_backward_ms_median"),
           bc_all = test_report_field(path, "comm_summary", "bcast_ms_median");
    ck_assert_msg(fabs(ex_all - (ex[0] + ex[1]) / 2) <= 1e-6 * (ex[0] + ex[1]) + 1e-9 &&
                      fabs(bc_all - (bc[0] + bc[1]) / 2) <= 1e-6 * (bc[0] + bc[1]) + 1e-9,
                  "summary %.9g, %.9g; ranks %.9g %.9g, %.9g %.9g", ex_all, bc_all, ex[0], ex[1], bc[0], bc[1]);
    /* a run too short to time (its one step is a warm-up step): n/a and JSON null, not medians of 0 ms */
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage3 --device cpu --model tiny --train-size 640 --test-size 64 --batch-size 16 --steps 1 "
                   "--epochs 1 --progress off --nproc-per-node 2 --master-port %d --report %s",
             test_root(), test_free_port(), path);
    ck_assert_msg(test_run(cmd, &out) == 0 &&
                      strstr(out, "per rank, ms (rank 0 … 1): forward+backward n/a n/a | waited after backward n/a "
                                  "n/a | waited for buffers n/a n/a\n"),
                  "%s", out);
    free(out);
    text = test_slurp(path, &len);
    ck_assert_msg(strstr(text, "\"fwd_bwd_ms_per_rank\":[null,null]"), "%s", text);
    free(text);
    /* one worker: no line (nothing to compare), but the JSON keeps its one value — bench_stage3.sh's
     * baseline for what a rank's forward + backward takes with no peer */
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage3 --device cpu --model tiny --train-size 640 --test-size 64 --batch-size 16 --steps 8 "
                   "--epochs 1 --progress off --nproc-per-node 1 --master-port %d --report %s",
             test_root(), test_free_port(), path);
    ck_assert_msg(test_run(cmd, &out) == 0 && !strstr(out, "per rank, ms"), "%s", out);
    free(out);
    ck_assert_int_eq(test_report_list(path, "comm_per_rank", "fwd_bwd_ms_per_rank", fb, 4), 1);
    ck_assert_msg(fb[0] > 0, "one rank: forward+backward %.3f ms", fb[0]);
    ck_assert_int_eq(test_report_list(path, "comm_per_rank", "bcast_ms_per_rank", bc, 4), 1);
    ck_assert_msg(bc[0] == 0, "one rank broadcasts nothing, yet waited %.3f ms", bc[0]);
}
END_TEST

/* ---- an unused parameter (--unused-param) and find_unused_parameters --------------------------------
 * PyTorch's behaviour, observed in torch (tests/fixtures/ddp_unused.txt, made by
 * tests/torch/ddp_unused_fixture.py), against ours. */

/* One `key=value` of the fixture's line that starts with `line_prefix` (copied into v). */
static void fixture_value(const char *line_prefix, const char *key, char *v, size_t len) {
    char path[600], line[1024], k[64];
    snprintf(path, sizeof path, "%s/tests/fixtures/ddp_unused.txt", test_root());
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "%s missing: regenerate it with python3 tests/torch/ddp_unused_fixture.py", path);
    snprintf(k, sizeof k, " %s=", key);
    while (fgets(line, sizeof line, f)) {
        char *at;
        if (strncmp(line, line_prefix, strlen(line_prefix)) || !(at = strstr(line, k))) continue;
        at += strlen(k);
        /* the value ends before the next " key=", or at the end of the line ("9 10") */
        size_t n = strcspn(at, "\n");
        char *eq = memchr(at, '=', n);
        if (eq)
            while (eq > at && eq[-1] != ' ') eq--;
        if (eq) n = (size_t)(eq - 1 - at);
        snprintf(v, len, "%.*s", (int)n, at);
        fclose(f);
        return;
    }
    fclose(f);
    ck_abort_msg("fixture ddp_unused.txt has no %s on a line starting %s", key, line_prefix);
}

static int64_t fixture_int(const char *line_prefix, const char *key) {
    char v[64];
    fixture_value(line_prefix, key, v, sizeof v);
    return atoll(v);
}

/* An integer field of the first JSON-lines record of `type` in the report at path. */
static int64_t report_int(const char *path, const char *type, const char *key) {
    long len;
    char *text = test_slurp(path, &len), pat[96];
    ck_assert_msg(text, "%s missing", path);
    snprintf(pat, sizeof pat, "\"type\":\"%s\"", type);
    char *rec = strstr(text, pat);
    ck_assert_msg(rec, "no %s record in %s", type, path);
    char *end = strchr(rec, '\n');
    if (end) *end = 0;
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *at = strstr(rec, pat);
    ck_assert_msg(at, "%s record has no %s", type, key);
    at += strlen(pat);
    int64_t v = atoll(at + (*at == '[')); /* a list: its first element */
    free(text);
    return v;
}

static Model *model_with_unused(Device *d, const char *arch, int norm_bn, int batch, uint64_t seed) {
    model_unused_param = 1;
    Model *m = model_create(d, arch, norm_bn, batch, seed);
    model_unused_param = 0;
    return m;
}

/* Without DDP the head is harmless: the same forward, the same gradients, none for fc_unused. */
START_TEST(unused_param_without_ddp) {
    Device d = {0};
    device_init(&d, DEV_CPU, 0, 0);
    Model *a = model_create(&d, "tiny", 1, 4, 3), *b = model_with_unused(&d, "tiny", 1, 4, 3);
    ck_assert_int_eq(b->n_params, a->n_params + 2);
    ck_assert_int_eq(b->unused_params, 2);
    ck_assert_str_eq(b->params[a->n_params].name, "fc_unused.weight");
    ck_assert_str_eq(b->params[a->n_params + 1].name, "fc_unused.bias");
    ck_assert(b->shape_hash != a->shape_hash); /* a checkpoint of one does not load into the other */
    int64_t n = a->n_param_floats, extra = b->n_param_floats - n;
    ck_assert_int_eq(extra, 10 * 64 + 10);
    ck_assert_int_eq(model_head_floats(a), extra); /* what a resume's message names the flag by */
    ck_assert_int_eq(model_head_floats(b), extra);
    /* every other parameter keeps its initial value; the head is nn.Linear's U(±1/√64), not zero */
    ck_assert(!memcmp(a->param_flat, b->param_flat, (size_t)n * sizeof(float)));
    double mx = 0;
    for (int64_t i = n; i < n + extra; i++) mx = test_max_nan(mx, fabs(b->param_flat[i]));
    ck_assert_msg(mx > 0.1 && mx <= 0.125, "fc_unused max |w| %g, bound 0.125", mx);
    float x[4 * 3 * 32 * 32], la, lb;
    int32_t y[4] = {1, 3, 5, 7}, ca, cb;
    test_fill_uniform(x, 4 * 3 * 32 * 32, 9, -1, 1);
    Model *ms[2] = {a, b};
    float *loss[2] = {&la, &lb};
    int32_t *corr[2] = {&ca, &cb};
    for (int k = 0; k < 2; k++) {
        model_zero_grad(ms[k]);
        model_forward(ms[k], 4, x, 1);
        xent_forward_backward(&d, 4, 10, model_logits(ms[k]), y, 0.25f, loss[k], corr[k], model_dlogits(ms[k]));
        model_backward(ms[k], 4, NULL, NULL);
    }
    ck_assert(la == lb);
    ck_assert(!memcmp(a->grad_flat, b->grad_flat, (size_t)n * sizeof(float)));
    for (int64_t i = n; i < n + extra; i++) ck_assert(b->grad_flat[i] == 0.0f);
    model_destroy(a), model_destroy(b);
    device_destroy(&d);
}
END_TEST

static jmp_buf died;
static void back_from_die_user(void) { longjmp(died, 1); }

/* The reducer on one rank: the hooks of every used parameter leave fc_unused's bucket (bucket 0 in
 * reverse order) pending, so nothing is launched; backward ends quietly; the next forward stops
 * naming the parameters. With find_unused_parameters every bucket goes, fc_unused's gradient stays
 * zero, the used-parameter map is all-reduced and read back, and the buckets are never rebuilt. */
START_TEST(unused_param_reducer) {
    OneRank o;
    model_unused_param = 1;
    one_rank_open(&o, "tiny");
    model_unused_param = 0;
    Model *m = o.m;
    int order[512];
    int n = ready_order(m, order);
    ck_assert_int_eq(n, m->n_params - 2); /* backward announces every parameter but fc_unused */
    Ddp d;
    DdpFlags f;
    free(ddp_options(&f, NULL));
    f.bucket_mb = 1e-6, f.bucket_mb_given = 1; /* a bucket per parameter, the first too */
    ddp_init(&d, &o.run, o.comm, &f);
    ck_assert_int_eq(d.bucket_of[m->n_params - 1], 0);
    model_zero_grad(m);
    ddp_forward_begin(&d);
    for (int i = 0; i < n; i++) ddp_grad_ready(&d, order[i]);
    ck_assert_int_eq(d.next, 0);
    ck_assert_int_eq(d.allreduce_calls, 0);
    ddp_backward_end(&d); /* no error here */
    ck_assert(d.unfinished);
    /* the next forward is a user error (die_user; its line is checked end to end below) — caught
     * here in process: a forked child would leave the store's and the ring's threads behind */
    volatile int stopped = 0;
    die_user_hook = back_from_die_user;
    if (setjmp(died) == 0) ddp_forward_begin(&d);
    else stopped = 1;
    die_user_hook = NULL;
    ck_assert_msg(stopped, "the forward after an unfinished reduction went ahead");
    ddp_destroy(&d);

    /* Under --optimizer-overlap DDP steps the optimizer bucket by bucket: with nothing launched,
     * nothing steps, and the step is not counted either — Adam's next bias correction (and the
     * checkpoint's step count) must not include a step no parameter took. */
    for (int mode = 0; mode < 2; mode++) {
        DdpFlags g = f;
        g.optimizer_overlap = mode ? "in-backward" : "after-backward";
        ddp_init(&d, &o.run, o.comm, &g);
        Optimizer opt;
        optim_init_named(&opt, "adam", &o.dev, m->n_param_floats, 0.1, 0.0, 0.0);
        ddp_register_fused_optim(&d, &opt, 0);
        ck_assert_ptr_eq(d.fused_optim, &opt);
        float w0 = m->param_flat[0];
        model_zero_grad(m);
        for (int64_t i = 0; i < m->n_param_floats; i++) m->grad_flat[i] = 1.0f;
        ddp_forward_begin(&d);
        for (int i = 0; i < n; i++) ddp_grad_ready(&d, order[i]);
        ck_assert_int_eq(d.next, 0);
        ddp_backward_end(&d);
        ck_assert_msg(opt.steps == 0 && optim_adam_steps(&opt) == 0,
                      "%s: a step with no bucket launched was counted (steps %lld, Adam's %lld)", g.optimizer_overlap,
                      (long long)opt.steps, (long long)optim_adam_steps(&opt));
        ck_assert(m->param_flat[0] == w0);
        ddp_destroy(&d);
        optim_destroy(&opt);
        model_set_hook_after_layer(m, 0);
    }

    f.find_unused = 1;
    ddp_init(&d, &o.run, o.comm, &f);
    for (int step = 0; step < 2; step++) {
        model_zero_grad(m);
        ddp_forward_begin(&d);
        for (int i = 0; i < n; i++) {
            ddp_grad_ready(&d, order[i]);
            ck_assert_int_eq(d.n_unused, 2); /* found at the first hook, before anything else */
        }
        ck_assert_int_eq(d.next, d.n_buckets);
        ck_assert_int_eq(d.allreduce_calls, (step + 1) * m->n_params);
        ddp_backward_end(&d);
        ck_assert(!d.unfinished);
        ck_assert_int_eq(d.used_map_calls, step + 1);
        ck_assert_int_eq(d.used_map_readbacks, step + 1);
        for (int p = m->n_params - 2; p < m->n_params; p++)
            for (int64_t i = 0; i < m->params[p].count; i++) ck_assert(m->grad_flat[m->params[p].offset + i] == 0.0f);
    }
    ck_assert(!d.rebuilt); /* step 2 began without a rebuild */
    ck_assert_int_eq(d.unused_bytes, (10 * 64 + 10) * 4);
    ddp_destroy(&d);
    one_rank_close(&o);
}
END_TEST

#define CPU_UNUSED "--device cpu --model tiny --norm none --train-size 256 --test-size 64 --epochs 1 --lr 0.05 " \
                   "--deterministic --progress off --nproc-per-node 2 --batch-size 16 --log-every 1"

/* Two ranks: the job stops at the forward of the step after the first, as torch does, quickly (the
 * timeout turns a hang into a failure); a one-step run ends cleanly, nothing all-reduced. */
START_TEST(unused_param_stops_every_rank) {
    char cmd[1024], *out, want[128], names[128];
    snprintf(cmd, sizeof cmd, "timeout -k 5 60 %s/stage3 " CPU_UNUSED " --unused-param --steps 3 --master-port %d",
             test_root(), test_free_port());
    ck_assert_int_eq(test_run(cmd, &out), 2);
    /* the parameters torch names, in its parameter numbering (the same as ours) */
    fixture_value("find_unused=0 unused_indices", "unused_indices", want, sizeof want);
    fixture_value("find_unused=0 unused_names", "unused_names", names, sizeof names);
    ck_assert_str_eq(want, "9 10");
    ck_assert_str_eq(names, "fc_unused.bias,fc_unused.weight");
    /* Each rank stops at its own check; the launcher stops whichever has not got there yet, so one
     * line is certain, and it is the first failure the launcher names. (Not "error: rank …": two
     * ranks' stderr may interleave between die_user's writes.) */
    char *failed = strstr(out, "job failed: rank "), line[256];
    ck_assert_msg(failed, "%s", out);
    snprintf(line, sizeof line, "rank %d: the previous step's gradient reduction never finished: "
                                "fc_unused.weight, fc_unused.bias (parameters 9, 10) got no gradient", atoi(failed + 17));
    ck_assert_msg(strstr(out, line), "the first rank to fail did not stop with the error:\n%s", out);
    snprintf(want, sizeof want, "exited with code 2 at step %lld",
             (long long)fixture_int("find_unused=0 steps=3", "raised_at_forward"));
    ck_assert_msg(strstr(out, "(first failure)"), "%s", out);
    ck_assert_msg(strstr(out, want), "expected '%s':\n%s", want, out);
    free(out);
    snprintf(cmd, sizeof cmd, "timeout -k 5 60 %s/stage3 " CPU_UNUSED " --unused-param --steps 1 --master-port %d",
             test_root(), test_free_port());
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_int_eq(fixture_int("find_unused=0 steps=1", "raised"), 0);
    snprintf(want, sizeof want, "| %lld gradient all-reduces (0 B)",
             (long long)fixture_int("find_unused=0 steps=1", "allreduces_per_step"));
    ck_assert_msg(strstr(out, want) && strstr(out, "warning: the last step's gradients were never all-reduced"),
                  "%s", out);
    free(out);
}
END_TEST

/* find_unused_parameters: 2 ranks × 16 with the unused head train exactly like one device × 32
 * without it — so both ranks' parameters agree (the logged loss is both ranks' mean) — fc_unused
 * never moves (no weight decay: its gradient stays zero), and the costs are torch's: two
 * all-reduces per step (the bucket, the used-parameter map), the bucket carrying fc_unused, no
 * rebuild; without any unused parameter the flag warns. */
START_TEST(find_unused_parameters_trains) {
    char dir[] = "/tmp/ddp_XXXXXX", cmd[2048], *out, path[600];
    ck_assert(mkdtemp(dir));
    const char *common = "--device cpu --model tiny --norm none --train-size 256 --test-size 64 --epochs 1 "
                         "--lr 0.05 --weight-decay 0 --deterministic --progress off --log-every 1 --steps 6";
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 %s --batch-size 32 --save %s/one --report %s/one.jsonl", test_root(),
             common, dir, dir);
    ck_assert_msg(test_run(cmd, &out) == 0, "stage1 failed:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage3 %s --nproc-per-node 2 --batch-size 16 --unused-param --find-unused-parameters "
                   "--master-port %d --save %s/ddp --report %s/ddp.jsonl",
             test_root(), common, test_free_port(), dir, dir);
    ck_assert_msg(test_run(cmd, &out) == 0, "stage3 failed:\n%s", out);
    ck_assert_msg(strstr(out, "does not use 2 parameters (fc_unused.weight, fc_unused.bias)") &&
                      !strstr(out, "buckets rebuilt") && strstr(out, "buckets never rebuilt"),
                  "%s", out);
    ck_assert_int_eq(fixture_int("find_unused=1", "rebuilt"), 0);
    free(out);
    double a[16], b[16];
    snprintf(path, sizeof path, "%s/one.jsonl", dir);
    ck_assert_int_eq(test_read_losses(path, a, 16), 6);
    snprintf(path, sizeof path, "%s/ddp.jsonl", dir);
    ck_assert_int_eq(test_read_losses(path, b, 16), 6);
    for (int i = 0; i < 6; i++)
        ck_assert_msg(fabs(a[i] - b[i]) <= 1e-5 * fabs(a[i]), "step %d loss %.9g (stage 1) vs %.9g", i + 1, a[i], b[i]);
    /* torch: two all-reduces per step, the bucket holding every parameter, fc_unused included */
    int64_t steps = report_int(path, "comm_summary", "optimizer_steps");
    ck_assert_int_eq(steps, 6);
    ck_assert_int_eq(report_int(path, "comm_summary", "allreduce_calls") + report_int(path, "comm_summary", "used_map_allreduces"),
                     steps * fixture_int("find_unused=1", "allreduces_per_step"));
    ck_assert_int_eq(report_int(path, "comm_summary", "bucket_bytes"), 4 * fixture_int("find_unused=1", "bucket_floats"));
    ck_assert_int_eq(report_int(path, "comm_summary", "unused_params"), 2);
    /* the final parameters: stage 1's, then fc_unused as initialised */
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/one/step%08d.ckpt", dir, 6);
    snprintf(pb, sizeof pb, "%s/ddp/step%08d.ckpt", dir, 6);
    int64_t n = test_n_params("tiny");
    float *one = test_load_params(pa, "tiny", 0);
    model_unused_param = 1;
    float *ddp = test_load_params(pb, "tiny", 0);
    model_unused_param = 0;
    double err = test_rel_err(ddp, one, n);
    ck_assert_msg(err <= 1e-5, "final parameters differ by %.3g (relative)", err);
    Device cpu = {0};
    device_init(&cpu, DEV_CPU, 0, 0);
    Model *init = model_with_unused(&cpu, "tiny", 0, 1, 0);
    ck_assert(!memcmp(ddp + n, init->param_flat + n, (size_t)(init->n_param_floats - n) * sizeof(float)));
    ck_assert_int_eq(fixture_int("find_unused=1", "unused_changed"), 0);
    model_destroy(init);
    device_destroy(&cpu);
    free(one), free(ddp);
    /* no unused parameter: the flag still costs the search and the map, and says so */
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 %s --nproc-per-node 2 --batch-size 16 --find-unused-parameters "
             "--master-port %d --report %s/plain.jsonl", test_root(), common, test_free_port(), dir);
    ck_assert_msg(test_run(cmd, &out) == 0, "stage3 failed:\n%s", out);
    ck_assert_msg(strstr(out, "warning: --find-unused-parameters found no unused parameter"), "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/plain.jsonl", dir);
    ck_assert_int_eq(report_int(path, "comm_summary", "allreduce_calls") + report_int(path, "comm_summary", "used_map_allreduces"),
                     6 * fixture_int("no_unused find_unused=1", "allreduces_per_step"));
}
END_TEST

/* ---- two ranks, two processes: the compression hook, the buffer broadcasts ----------------------- */

/* fp16_compress_hook's arithmetic, per element, for two ranks: buffer.to(float16).div_(2) on each rank
 * (on a CUDA tensor a multiply by fp32's 1/2, rounded once to fp16), the fp16 SUM (one rounding for
 * two terms, in either order), copied back into the fp32 bucket. */
static float torch_fp16_hook_mean(float g0, float g1) {
    float q0 = f16_to_f32(f32_to_f16(f16_to_f32(f32_to_f16(g0)) * 0.5f));
    float q1 = f16_to_f32(f32_to_f16(f16_to_f32(f32_to_f16(g1)) * 0.5f));
    return f16_to_f32(f32_to_f16(q0 + q1));
}

/* Rank r's gradient element i: uniform values, and three that tell the orders apart — cast first
 * (the hook's) or divide first: 70000 is inf in fp16 before the division and 35000 after it, so the
 * GradScaler would skip the step with the one and not the other; 2.75·2⁻²⁴ rounds (cast, then
 * halve, ties to even) to 2⁻²³ and (halve, then cast) to 2⁻²⁴; and −70000 + 70000 is inf − inf. */
static void hook_grads(float *g, int64_t n, int rank) {
    test_fill_uniform(g, n, 17 + (uint64_t)rank, -3.0f, 3.0f);
    g[0] = rank == 0 ? 70000.0f : 1.0f;
    g[1] = rank == 0 ? 2.75f * ldexpf(1.0f, -24) : 0.0f;
    g[2] = rank == 0 ? -70000.0f : 70000.0f;
}

/* One rank of a two-rank job over the host ring: the tiny model with batch norm, its Run. */
static void two_rank_open(OneRank *o, int rank, int port) {
    memset(o, 0, sizeof *o);
    device_init(&o->dev, DEV_CPU, 0, 0);
    setenv("STAGE_RDZV_SECRET", TEST_SECRET, 1);
    o->store = store_open("127.0.0.1", port, rank, 2, 10);
    o->comm = comm_create(COMM_HOST, o->store, &o->dev, 10);
    config_defaults(&o->cfg);
    o->m = model_create(&o->dev, "tiny", 1, 1, 0);
    o->run = (Run){.cfg = &o->cfg, .world_size = 2, .rank = rank, .model = o->m};
    report_open(&o->run.report, "", "off", 0);
}

/* rank_main(0, port) and rank_main(1, port), each in a process of its own (each its own model and
 * reducer; threads would share the CPU backend's state); each returns 0, or 1 with a line on stderr. */
static void run_two_rank_processes(int (*rank_main)(int rank, int port)) {
    int port = test_free_port();
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        ck_assert(pid[r] >= 0);
        if (pid[r] == 0) _exit(rank_main(r, port));
    }
    for (int r = 0; r < 2; r++) {
        int st = 0;
        ck_assert(waitpid(pid[r], &st, 0) == pid[r]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: status %d (its line above)", r, st);
    }
}

/* One rank of compress_hook_casts_then_divides: 0 if every averaged element is torch's. */
static int hook_rank(int rank, int port) {
    OneRank o;
    two_rank_open(&o, rank, port);
    Model *m = o.m;
    Ddp d;
    DdpFlags f;
    free(ddp_options(&f, NULL));
    f.bucket_mb = 0.01, f.bucket_mb_given = 1; /* several buckets: each cast and reduced on its own */
    ddp_init(&d, &o.run, o.comm, &f);
    ddp_register_comm_hook(&d, PREC_FP16);
    int64_t n = m->n_param_floats;
    float *mine = malloc((size_t)n * sizeof(float)), *other = malloc((size_t)n * sizeof(float));
    hook_grads(mine, n, rank), hook_grads(other, n, 1 - rank);
    memcpy(m->grad_flat, mine, (size_t)n * sizeof(float));
    int order[512], bad = 0;
    int k = ready_order(m, order);
    ddp_forward_begin(&d);
    for (int i = 0; i < k; i++) ddp_grad_ready(&d, order[i]);
    ddp_backward_end(&d);
    if (d.allreduce_calls < 2) fprintf(stderr, "rank %d: %lld all-reduces, expected one per bucket\n", rank,
                                       (long long)d.allreduce_calls), bad = 1;
    for (int64_t i = 0; i < n && !bad; i++) {
        float want = torch_fp16_hook_mean(rank ? other[i] : mine[i], rank ? mine[i] : other[i]), got = m->grad_flat[i];
        if (memcmp(&got, &want, sizeof got) && !(isnan(got) && isnan(want)))
            fprintf(stderr, "rank %d: element %lld = %.9g, fp16_compress_hook gives %.9g\n", rank, (long long)i, got,
                    want), bad = 1;
    }
    ddp_destroy(&d);
    free(mine), free(other);
    one_rank_close(&o);
    return bad;
}

/* --grad-comm fp16 is fp16_compress_hook: each bucket cast to fp16, divided by the world size (in
 * fp16, after the cast), summed in fp16 and copied back — its bits, element for element, on two
 * ranks (two processes: each its own model and reducer). The order matters beyond rounding: a
 * scaled gradient above fp16's range is inf whatever the division would have made of it, and the
 * scaler then skips the step (stage 5's README). */
START_TEST(compress_hook_casts_then_divides) {
    ck_assert(isinf(torch_fp16_hook_mean(70000.0f, 1.0f)) && torch_fp16_hook_mean(2.75f * ldexpf(1.0f, -24), 0) ==
                                                                ldexpf(1.0f, -23)); /* the reference itself */
    run_two_rank_processes(hook_rank);
}
END_TEST

/* Rank r's buffers: a value of its own in every float (t tells the moments apart). */
static void own_buffers(Model *m, int rank, float t) {
    for (int64_t i = 0; i < m->n_buffer_floats; i++) m->buffer_flat[i] = (float)(100 * rank) + t + (float)i;
}

/* Whether every buffer float is rank `from`'s own_buffers(·, from, t). */
static int buffers_are(const Model *m, int from, float t) {
    for (int64_t i = 0; i < m->n_buffer_floats; i++)
        if (m->buffer_flat[i] != (float)(100 * from) + t + (float)i) return 0;
    return 1;
}

/* One rank of buffer_broadcasts_come_from_rank_0: 0 if the buffers were rank 0's (or its own) at each
 * moment checked. */
static int buffers_rank(int rank, int port) {
    OneRank o;
    two_rank_open(&o, rank, port);
    Model *m = o.m;
    int order[512], n = ready_order(m, order), bad = 0;
    for (int after = 0; after < 2 && !bad; after++) {
        const char *mode = after ? "after-forward" : "before-forward";
        Ddp d;
        DdpFlags f;
        free(ddp_options(&f, NULL));
        f.broadcast_buffers = mode;
        own_buffers(m, rank, 0.25f);
        ddp_init(&d, &o.run, o.comm, &f);
        if (!buffers_are(m, 0, 0.25f))
            fprintf(stderr, "rank %d, %s: after DDP's construction the buffers are not rank 0's\n", rank, mode), bad = 1;
        own_buffers(m, rank, 0.5f); /* as a forward of its own batch would leave them */
        ddp_forward_begin(&d);
        /* the default broadcasts before this forward (the flag starts set); after-forward does not */
        if (!bad && !buffers_are(m, after ? rank : 0, 0.5f))
            fprintf(stderr, "rank %d, %s: before the first forward the buffers are not %s\n", rank, mode,
                    after ? "its own" : "rank 0's"), bad = 1;
        own_buffers(m, rank, 0.75f); /* the forward updates them */
        for (int i = 0; i < n; i++) ddp_grad_ready(&d, order[i]);
        ddp_backward_end(&d);
        /* after-forward: the synchronising backward broadcast what that forward left on rank 0 */
        if (!bad && !buffers_are(m, after ? 0 : rank, 0.75f))
            fprintf(stderr, "rank %d, %s: after the backward the buffers are not %s\n", rank, mode,
                    after ? "rank 0's" : "its own"), bad = 1;
        ddp_destroy(&d);
    }
    one_rank_close(&o);
    return bad;
}

/* broadcast_buffers=True: the buffers every rank holds are rank 0's — from DDP's construction
 * (_sync_module_states, src=0), before each forward that require_forward_param_sync marks (the flag
 * starts set), or with --broadcast-buffers after-forward from the synchronising backward, and never
 * another rank's. Nothing else shows it: every rank builds the same buffers, and in training batch
 * norm normalises with its batch's statistics, not these. */
START_TEST(buffer_broadcasts_come_from_rank_0) {
    run_two_rank_processes(buffers_rank);
}
END_TEST

/* ---- the optimizer in backward ------------------------------------------------------------------ */

/* Run `stage args` with each --optimizer-overlap and require the same final checkpoint, byte for
 * byte: each bucket stepped once its all-reduce is done must be the step optim_step takes after
 * backward (elementwise, so its slices give the same bits) — and, on a GPU, no slice may step a
 * weight that backward still reads (a conv's input gradient) or a gradient not yet all-reduced:
 * either would change bits. */
static void check_fused_same_bits(const char *stage, const char *args, const char *what) {
    static const char *const mode[3] = {"off", "in-backward", "after-backward"};
    char *dir = test_tmpdir(), cmd[4096], path[3][700], *out;
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, LIMIT "%s/%s %s --optimizer-overlap %s --master-port %d --save %s/f%d", test_root(),
                 stage, args, mode[i], test_free_port(), dir, i);
        ck_assert_msg(test_run(cmd, &out) == 0, "%s (%s): exit != 0\n%s\n%s", what, mode[i], cmd, out);
        ck_assert_msg(!i == !strstr(out, "each bucket's parameters step"), "%s, %s: the overlap line:\n%s", what,
                      mode[i], out);
        free(out);
        snprintf(path[i], sizeof path[i], "%s/f%d/epoch001.ckpt", dir, i);
    }
    long na, nb;
    char *a = test_slurp(path[0], &na);
    ck_assert_msg(a, "%s: no checkpoint %s", what, path[0]);
    for (int i = 1; i < 3; i++) {
        char *b = test_slurp(path[i], &nb);
        ck_assert_msg(b, "%s: no checkpoint %s", what, path[i]);
        ck_assert_msg(na == nb && !memcmp(a, b, (size_t)na), "%s: --optimizer-overlap %s changed the trained bits", what,
                      mode[i]);
        free(b);
    }
    free(a), free(dir);
}

#define CPU_FUSED "--device cpu --model tiny --norm bn --train-size 256 --test-size 32 --epochs 1 --batch-size 16 " \
                  "--deterministic --progress off --nproc-per-node 2"

START_TEST(optimizer_in_backward_same_bits) {
    check_fused_same_bits("stage3", CPU_FUSED, "stage 3, SGD, one bucket");
    check_fused_same_bits("stage3", CPU_FUSED " --bucket-mb 0.001", "stage 3, SGD, a bucket per parameter");
    check_fused_same_bits("stage3", CPU_FUSED " --bucket-mb 0.01 --optimizer adam", "stage 3, Adam, small buckets");
    check_fused_same_bits("stage4", CPU_FUSED " --bucket-mb 0.01 --accum-steps 3", "stage 4, K = 3");
    check_fused_same_bits("stage5", CPU_FUSED " --bucket-mb 0.01 --amp bf16 --grad-comm bf16",
                          "stage 5, bf16, bf16_compress_hook");
    /* the per-bucket steps are optimizer steps too: stage 5's amp record counts them (it said 0) */
    char *dir = test_tmpdir(), cmd[2048], rep[700], *out;
    snprintf(rep, sizeof rep, "%s/r.jsonl", dir);
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage5 " CPU_FUSED " --amp bf16 --optimizer-overlap after-backward "
             "--master-port %d --report %s", test_root(), test_free_port(), rep);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s\n%s", cmd, out);
    double steps = test_report_field(rep, "summary", "steps");
    ck_assert_msg(steps > 0 && test_report_field(rep, "amp", "optimizer_steps") == steps, "amp optimizer_steps %g, "
                  "summary steps %g", test_report_field(rep, "amp", "optimizer_steps"), steps);
    free(out), free(dir);
}
END_TEST

/* The --help entry of --optimizer-overlap in `stage` (from its line to the next flag's), its wrapped
 * lines joined by single spaces. */
static char *optimizer_overlap_help(const char *stage) {
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s/%s --help", test_root(), stage);
    test_run_ok(cmd, "--help", &out);
    char *entry = strstr(out, "\n  --optimizer-overlap");
    ck_assert_msg(entry, "%s --help has no --optimizer-overlap:\n%s", stage, out);
    char *end = strstr(entry + 1, "\n  --");
    if (end) *end = 0;
    char *joined = xstrdup(entry), *w = joined;
    for (const char *r = entry; *r; r++)
        if (!(*r == ' ' || *r == '\n') || (w > joined && w[-1] != ' ')) *w++ = (*r == '\n') ? ' ' : *r;
    *w = 0;
    free(out);
    return joined;
}

/* The combinations that cannot work are refused before training, naming the fix — and the flag's
 * --help names each of them (it listed only three, so `--help` let a student pair it with
 * --clip-grad-norm or --grad-stats and meet the refusal only at run time). */
START_TEST(optimizer_in_backward_refusals) {
    static const struct {
        const char *cmd, *says, *help_names;
    } cases[] = {
        {"stage3 " CPU_FUSED " --optimizer-overlap in-backward --no-overlap", "drop one of the two", "--no-overlap"},
        {"stage3 " CPU_FUSED " --optimizer-overlap after-backward --clip-grad-norm 1", "before that norm exists",
         "--clip-grad-norm"},
        {"stage4 " CPU_FUSED " --optimizer-overlap after-backward --accum-steps 2 --sync-each-micro-step",
         "every micro-batch", "--sync-each-micro-step"},
        {"stage5 " CPU_FUSED " --optimizer-overlap in-backward --amp fp16", "--amp bf16", "fp16's GradScaler"},
        {"stage5 " CPU_FUSED " --optimizer-overlap after-backward --amp fp16 --no-grad-scaler",
         "cannot run with --no-grad-scaler", "--no-grad-scaler"},
        {"stage5 " CPU_FUSED " --optimizer-overlap after-backward --amp bf16 --grad-stats", "cannot run with --grad-stats",
         "--grad-stats"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char stage[16], *help;
        snprintf(stage, sizeof stage, "%.6s", cases[i].cmd);
        help = optimizer_overlap_help(stage);
        ck_assert_msg(strstr(help, cases[i].help_names), "%s --help does not say --optimizer-overlap is refused with %s:\n%s",
                      stage, cases[i].help_names, help);
        free(help);
        char cmd[2048], *out;
        snprintf(cmd, sizeof cmd, LIMIT "%s/%s --steps 2 --master-port %d", test_root(), cases[i].cmd, test_free_port());
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 2 && strstr(out, cases[i].says) && !strstr(out, "summary:"), "%s: exit %d\n%s", cases[i].cmd,
                      rc, out);
        /* refused once, by the launcher, before any worker starts (amp_check, config_resolve) */
        ck_assert_msg(!strstr(out, "launching") && !strstr(strstr(out, "error:") + 1, "error:"), "%s\n%s",
                      cases[i].cmd, out);
        free(out);
    }
}
END_TEST

/* Each epoch's end reports that epoch's communication (ddp_epoch_end: the "  comm:" line and a
 * comm_epoch record), in every DDP stage: two epochs, two records, numbered 1 and 2, before the run's
 * comm_summary. */
START_TEST(every_ddp_stage_reports_each_epochs_comm) {
    const char *stages[] = {"stage3", "stage4 --accum-steps 2", "stage5 --amp bf16"};
    for (int i = 0; i < 3; i++) {
        char *dir = test_tmpdir(), cmd[2048], rep[700], *out;
        snprintf(rep, sizeof rep, "%s/r.jsonl", dir);
        snprintf(cmd, sizeof cmd, LIMIT "%s/%s --device cpu --model tiny --train-size 256 --test-size 32 --epochs 2 "
                 "--batch-size 16 --progress off --nproc-per-node 2 --master-port %d --report %s", test_root(),
                 stages[i], test_free_port(), rep);
        ck_assert_msg(test_run(cmd, &out) == 0, "%s\n%s", cmd, out);
        double epoch[8];
        int n = test_report_series(rep, "comm_epoch", "epoch", epoch, 8);
        ck_assert_msg(n == 2 && epoch[0] == 1 && epoch[1] == 2, "%s: %d comm_epoch records for 2 epochs\n%s",
                      stages[i], n, out);
        ck_assert_msg(test_report_field(rep, "comm_summary", "step") > 0, "%s: no comm_summary\n%s", stages[i], out);
        free(out), free(dir);
    }
}
END_TEST

/* ---- on GPUs --------------------------------------------------------------------------------- */

#define GPU_EQ "--device cuda --model tiny --norm none --train-size 512 --test-size 64 --epochs 1 --lr 0.05 " \
               "--deterministic --no-tf32 --progress off"

START_TEST(ddp_nccl_matches_one_gpu) {
    if (!test_have_gpu("DDP over NCCL ≡ one GPU")) return;
    if (device_cuda_count() < 2) {
        printf("SKIP: DDP over NCCL ≡ one GPU — needs 2 GPUs, %d visible (the --comm host test covers one)\n",
               device_cuda_count());
        return;
    }
    check_equivalence(GPU_EQ, 2, 32, 6, "", "--comm nccl", "2 GPUs, NCCL, overlap");
    check_equivalence(GPU_EQ, 2, 32, 6, "", "--comm nccl --no-overlap --bucket-mb 0.01", "2 GPUs, NCCL, --no-overlap");
}
END_TEST

START_TEST(ddp_host_comm_two_workers_one_gpu) {
    if (!test_have_gpu("DDP --comm host, 2 workers on 1 GPU")) return;
    setenv("CUDA_VISIBLE_DEVICES", "0", 1); /* both workers on the first GPU */
    check_equivalence(GPU_EQ, 2, 32, 6, "", "--comm host", "2 workers sharing GPU 0, --comm host");
    check_equivalence(GPU_EQ, 2, 32, 6, "", "--comm host --bucket-mb 0.001", "2 workers sharing GPU 0, many buckets");
    unsetenv("CUDA_VISIBLE_DEVICES");
}
END_TEST

/* On one GPU: one process over NCCL (in-backward's side stream really overlaps backward, with CUDA graphs),
 * and two workers sharing the GPU over --comm host; with many buckets, so many slices race backward
 * if anything is ordered wrong. Stage 5 in bf16 with the bf16 compression hook too. */
START_TEST(optimizer_in_backward_same_bits_gpu) {
    if (!test_have_gpu("--optimizer-in-backward on a GPU")) return;
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);
#define GPU_FUSED "--device cuda --model resnet18 --train-size 1024 --test-size 128 --epochs 1 --batch-size 64 " \
                  "--deterministic --progress off"
    check_fused_same_bits("stage3", GPU_FUSED " --nproc-per-node 1 --comm nccl --bucket-mb 2", "1 GPU, NCCL, 2 MiB buckets");
    check_fused_same_bits("stage3", GPU_FUSED " --nproc-per-node 1 --comm nccl --no-cuda-graph --bucket-mb 2",
                          "1 GPU, NCCL, eager");
    check_fused_same_bits("stage3", GPU_FUSED " --nproc-per-node 2 --comm host --bucket-mb 5", "2 workers on 1 GPU, --comm host");
    check_fused_same_bits("stage5", GPU_FUSED " --nproc-per-node 1 --comm nccl --bucket-mb 2 --amp bf16 --grad-comm bf16",
                          "1 GPU, stage 5 bf16, bf16_compress_hook");
    unsetenv("CUDA_VISIBLE_DEVICES");
}
END_TEST

START_TEST(nccl_refuses_more_workers_than_gpus) {
    if (!test_have_gpu("--comm nccl with more workers than GPUs")) return;
    char cmd[512], *out;
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 --device cuda --comm nccl --nproc-per-node %d --steps 1", test_root(),
             device_cuda_count() + 1);
    ck_assert_int_eq(test_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--comm host") && !strstr(out, "launching"), "%s", out);
    free(out);
}
END_TEST

/* ResNet-18 with batch norm over NCCL: trains, reports its communication, balances memory. */
START_TEST(ddp_nccl_resnet18_reports) {
    if (!test_have_gpu("DDP ResNet-18 over NCCL") || device_cuda_count() < 2) return;
    char dir[] = "/tmp/ddp_XXXXXX", cmd[1024], *out, path[600];
    ck_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 --nproc-per-node 2 --train-size 4096 --test-size 512 --steps 30 "
             "--log-every 10 --progress off --master-port %d --report %s/r.jsonl", test_root(), test_free_port(), dir);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "comm: all-reduce") && strstr(out, "NCCL"), "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    double fb[4];
    ck_assert_int_eq(test_report_list(path, "comm_per_rank", "fwd_bwd_ms_per_rank", fb, 4), 2);
    ck_assert_msg(fb[0] > 0 && fb[1] > 0, "forward+backward per rank: %g %g ms", fb[0], fb[1]);
    FILE *f = fopen(path, "r");
    ck_assert(f);
    char line[8192];
    int have_summary = 0, have_comm = 0;
    while (fgets(line, sizeof line, f)) {
        have_comm |= strstr(line, "\"type\":\"comm_summary\"") != NULL;
        if (strstr(line, "\"type\":\"summary\"")) {
            have_summary = 1;
            char *p = strstr(line, "\"peak_mem_bytes\":[");
            ck_assert(p);
            double a = atof(p + 18), b = atof(strchr(p, ',') + 1);
            ck_assert_msg(a > 0 && b > 0 && fmax(a, b) / fmin(a, b) <= 1.05, "per-GPU memory unbalanced: %.0f vs %.0f", a, b);
        }
    }
    fclose(f);
    ck_assert(have_summary && have_comm);
}
END_TEST

Suite *suite_ddp(void) {
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* no NVLink multicast in any worker these tests start */
    Suite *s = suite_create("ddp");
    TCase *tc = tcase_create("ddp");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, sharded_batches_union_is_global_batch);
    tcase_add_test(tc, buckets_reverse_then_rebuilt_in_ready_order);
    tcase_add_test(tc, bucket_extremes);
    tcase_add_test(tc, small_last_bucket);
    tcase_add_test(tc, bucket_closes_at_exactly_its_cap);
    tcase_add_test(tc, last_bucket_exact_and_too_large);
    tcase_add_test(tc, last_bucket_too_large_is_said);
    tcase_add_test(tc, find_unused_plans_first_bucket_at_1mib);
    tcase_add_test(tc, buckets_are_torchs);
    tcase_add_test(tc, command_line_buckets_are_torchs);
    tcase_add_test(tc, ddp_cpu_matches_one_device);
    tcase_add_test(tc, sharded_evaluation_scores_each_test_sample_once);
    tcase_add_test(tc, evaluation_uses_rank_0s_broadcast_buffers);
    tcase_add_test(tc, per_rank_times_are_reported);
    tcase_add_test(tc, unused_param_without_ddp);
    tcase_add_test(tc, unused_param_reducer);
    tcase_add_test(tc, unused_param_stops_every_rank);
    tcase_add_test(tc, find_unused_parameters_trains);
    tcase_add_test(tc, compress_hook_casts_then_divides);
    tcase_add_test(tc, buffer_broadcasts_come_from_rank_0);
    tcase_add_test(tc, optimizer_in_backward_same_bits);
    tcase_add_test(tc, optimizer_in_backward_refusals);
    tcase_add_test(tc, every_ddp_stage_reports_each_epochs_comm);
    tcase_add_test(tc, ddp_nccl_matches_one_gpu);
    tcase_add_test(tc, ddp_host_comm_two_workers_one_gpu);
    tcase_add_test(tc, optimizer_in_backward_same_bits_gpu);
    tcase_add_test(tc, nccl_refuses_more_workers_than_gpus);
    tcase_add_test(tc, ddp_nccl_resnet18_reports);
    suite_add_tcase(s, tc);
    return s;
}
