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
 * sharded_batches_union_is_global_batch checks that claim; the runs check the rest. */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "comm.h"
#include "ddp.h"
#include "device.h"
#include "loader.h"
#include "model.h"
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

/* Buckets are contiguous slices that tile the gradient buffer, each closed by PyTorch's rule. */
static void check_plan(const Ddp *d, const int *order, size_t first_limit, size_t limit) {
    const Model *m = d->m;
    int64_t covered = 0;
    int i = 0;
    for (int b = 0; b < d->n_buckets; b++) {
        const DdpBucket *k = &d->buckets[b];
        covered += k->count;
        /* its parameters are the next ones in `order`, and exactly fill the slice */
        int64_t sum = 0, lo = INT64_MAX, hi = 0;
        size_t lim = b == 0 ? first_limit : limit, bytes = (size_t)k->count * 4;
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
        if (b < d->n_buckets - 1) ck_assert_msg(bytes >= lim, "bucket %d closed early: %zu < %zu bytes", b, bytes, lim);
    }
    ck_assert_int_eq(i, m->n_params);
    ck_assert_int_eq(covered, m->n_param_floats);
}

START_TEST(buckets_reverse_then_rebuilt_in_ready_order) {
    OneRank o;
    one_rank_open(&o, "resnet18");
    Model *m = o.m;
    int order[512] = {0}, reverse[512] = {0};
    int n = ready_order(m, order);
    ck_assert_int_eq(n, m->n_params);
    for (int i = 0; i < n; i++) reverse[i] = n - 1 - i;
    size_t cap = 4 << 20;
    Ddp d;
    DdpFlags f;
    free(ddp_options(&f, NULL));
    f.bucket_mb = 4.0;
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
    /* Step 2 rebuilds in that order, the first bucket closed at 1 MiB. */
    ddp_forward_begin(&d);
    ck_assert(d.rebuilt);
    check_plan(&d, order, DDP_FIRST_BUCKET_BYTES, cap);
    /* the first bucket is closed at 1 MiB: the classifier, the last BN and the last conv (9 MiB) */
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
    checkpoint_load(path, &expect, &got, p, buf, mom);
    free(mom), free(buf);
    model_destroy(m);
    device_destroy(&cpu);
    return p;
}

int64_t test_n_params(const char *arch) {
    Device cpu = {0};
    device_init(&cpu, DEV_CPU, 0, 0);
    Model *m = model_create(&cpu, arch, 0, 1, 0);
    int64_t n = m->n_param_floats;
    model_destroy(m);
    device_destroy(&cpu);
    return n;
}

/* Train `steps` steps of stage 1 at batch R·B and of stage 3 with R ranks at batch B (extra flags
 * for each), then compare every logged loss and the final parameters. */
static void check_equivalence(const char *common, int world, int batch, int steps, const char *stage1_extra,
                              const char *stage3_extra, const char *what) {
    char dir[] = "/tmp/ddp_XXXXXX", cmd[4096], *out;
    ck_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage1 %s %s --batch-size %d --steps %d --log-every 1 --save %s/one --report %s/one.jsonl",
             test_root(), common, stage1_extra, world * batch, steps, dir, dir);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s: stage1 failed:\n%s", what, out);
    free(out);
    snprintf(cmd, sizeof cmd,
             LIMIT "%s/stage3 %s %s --nproc-per-node %d --batch-size %d --steps %d --log-every 1 --master-port %d "
                   "--save %s/ddp --report %s/ddp.jsonl",
             test_root(), common, stage3_extra, world, batch, steps, test_free_port(), dir, dir);
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

#define CPU_EQ "--device cpu --model tiny --norm none --train-size %d --test-size 64 --epochs 1 --lr 0.05 --deterministic --progress off"

START_TEST(ddp_cpu_matches_one_device) {
    char common[512];
    snprintf(common, sizeof common, CPU_EQ, 256); /* 8 steps of 32 per epoch; 6 are run */
    check_equivalence(common, 2, 16, 6, "", "", "2 ranks, overlap, default buckets");
    check_equivalence(common, 2, 16, 6, "", "--no-overlap", "2 ranks, --no-overlap");
    check_equivalence(common, 2, 16, 6, "", "--bucket-mb 0.001", "2 ranks, one bucket per parameter");
    check_equivalence(common, 2, 16, 6, "", "--bucket-mb 1000", "2 ranks, one huge bucket");
    snprintf(common, sizeof common, CPU_EQ, 288); /* 3 × 16 = 48 per step, 6 steps per epoch */
    check_equivalence(common, 3, 16, 5, "", "--bucket-mb 0.01", "3 ranks, small buckets");
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
    tcase_add_test(tc, ddp_cpu_matches_one_device);
    tcase_add_test(tc, ddp_nccl_matches_one_gpu);
    tcase_add_test(tc, ddp_host_comm_two_workers_one_gpu);
    tcase_add_test(tc, nccl_refuses_more_workers_than_gpus);
    tcase_add_test(tc, ddp_nccl_resnet18_reports);
    suite_add_tcase(s, tc);
    return s;
}
