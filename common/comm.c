/* comm.c — the communicator (see comm.h): the operation ring every backend shares, and the public
 * calls, each dispatched through the backend's table (comm_internal.h).
 *
 * Both backends keep a ring of the last OPS operations (what, where, when issued, how long it
 * took), so DDP can read each bucket's all-reduce time a few steps later without synchronising. */
#include "comm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm_internal.h"
#include "errors.h"
#include "worker_status.h" /* launch_mark_collateral */

int comm_have_nccl(void) {
#ifdef USE_NCCL
    return 1;
#else
    return 0;
#endif
}

CommKind comm_choose(const char *flag, int cuda, int gpus, int local_workers) {
    CommKind kind = !strcmp(flag, "nccl")   ? COMM_NCCL
                    : !strcmp(flag, "host") ? COMM_HOST
                    : cuda && comm_have_nccl() ? COMM_NCCL : COMM_HOST;
    if (kind != COMM_NCCL) return kind;
    if (!cuda) die_user("--comm nccl needs GPU workers (NCCL moves GPU memory); CPU workers use --comm host");
    if (!comm_have_nccl())
        die_user("--comm nccl: this binary was built without NCCL — install NCCL 2 (or set NCCL_HOME) and "
                 "rebuild, or use --comm host");
    if (local_workers > gpus)
        die_user("%d workers per node with --comm nccl need %d GPUs, but %d %s visible — NCCL needs one GPU "
                 "per worker: use --nproc-per-node %d, or --comm host to let workers share GPUs",
                 local_workers, local_workers, gpus, gpus == 1 ? "is" : "are", gpus);
    return kind;
}

const char *comm_describe(const Comm *c) { return c->desc; }

/* Marked as collateral for the launcher, then out at once. _exit, not exit: another thread may be inside the CUDA runtime, whose exit
 * handlers could then hang. */
void comm_fail(const Comm *c, const char *fmt, ...) {
    launch_quiet_if_output_gone();
    fflush(stdout);
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "error: rank %d: %s\n", c->rank, msg);
    fflush(stderr);
    launch_mark_collateral();
    _exit(1);
}

/* ---- the operation ring ---------------------------------------------------------------------- */

/* Take the slot of the next operation, waiting (rarely) for the one OPS ago to be retired. */
Op *comm_op_begin(Comm *c, OpKind kind, void *buf, int64_t count, int root, CommDtype type) {
    pthread_mutex_lock(&c->mu);
    while (c->issued - c->done >= OPS) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    Op *op = &c->ops[c->issued % OPS];
    op->kind = kind, op->buf = buf, op->count = count, op->root = root, op->type = type;
    op->t_issue = time_now();
    op->ms = 0;
#ifdef USE_CUDA
    if (c->dev->kind == DEV_CUDA && !op->have_events) {
        device_bind(c->dev);
        CHECK_CUDA(cudaEventCreateWithFlags(&op->ready, cudaEventDisableTiming));
        CHECK_CUDA(cudaEventCreate(&op->start));
        CHECK_CUDA(cudaEventCreate(&op->end));
        op->have_events = 1;
    }
#endif
    return op;
}

int64_t comm_op_publish(Comm *c) {
    pthread_mutex_lock(&c->mu);
    int64_t id = c->issued++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return id;
}

void comm_wait_done(Comm *c, int64_t upto) {
    pthread_mutex_lock(&c->mu);
    while (c->done < upto) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* ---- the interface: each call through the backend's table --------------------------------------- */

/* Every rank must build the same kind of communicator: an NCCL rank and a host-ring rank would each
 * wait for the other's half of a different handshake, and nothing compares the ranks' flags before
 * there is a communicator to compare them over (ddp.c). So each rank leaves its kind in the store,
 * rank 0 reads them all and leaves its verdict, and every rank reads that (2 requests a rank, not
 * one per pair). A difference comes from --device (auto: NCCL for GPU workers, the host ring for
 * CPU ones) or --comm given differently on different nodes or under torchrun. */
static void agree_on_kind(Comm *c, int seq) {
    static const char *const what[] = {[COMM_NCCL] = "NCCL (a GPU worker)",
                                       [COMM_HOST] = "the host ring (a CPU worker, or --comm host)"};
    char key[64], mine = (char)c->kind, verdict[512] = "";
    snprintf(key, sizeof key, "comm%d/kind/%d", seq, c->rank);
    store_set(c->store, key, &mine, 1);
    snprintf(key, sizeof key, "comm%d/kind/verdict", seq);
    if (c->rank == 0) {
        for (int r = 1; r < c->world && !verdict[0]; r++) {
            char theirs = 0, rkey[64];
            snprintf(rkey, sizeof rkey, "comm%d/kind/%d", seq, r);
            store_get(c->store, rkey, &theirs, 1);
            if (theirs != mine)
                snprintf(verdict, sizeof verdict, "rank 0 communicates over %s, but rank %d over %s — start every "
                         "rank with the same --device and --comm", what[(int)mine], r,
                         theirs == COMM_NCCL || theirs == COMM_HOST ? what[(int)theirs] : "a kind this build lacks");
        }
        store_set(c->store, key, verdict, strlen(verdict));
    } else {
        size_t n = store_get(c->store, key, verdict, sizeof verdict - 1);
        verdict[n < sizeof verdict ? n : sizeof verdict - 1] = 0;
    }
    if (verdict[0]) die_collateral(c->rank != 0, 2, "%s", verdict); /* rank 0's verdict */
}

Comm *comm_create(CommKind kind, Store *store, Device *dev, double timeout_s) {
    Comm *c = xcalloc(1, sizeof *c);
    c->kind = kind, c->store = store, c->dev = dev, c->timeout = timeout_s;
    c->rank = store_rank(store), c->world = store_world(store);
    c->left = c->right = -1;
    xmutex_init(&c->mu);
    xcond_init(&c->cv);
#ifdef USE_NCCL
    c->be = kind == COMM_NCCL ? &comm_nccl_ops : &comm_host_ops;
#else
    if (kind == COMM_NCCL)
        die_user("--comm nccl: this binary was built without NCCL — install NCCL 2 (or set NCCL_HOME) and "
                 "rebuild, or use --comm host");
    c->be = &comm_host_ops;
#endif
    int seq = store_sequence(store); /* names this communicator's keys */
    agree_on_kind(c, seq);
    c->be->create(c, seq);
    return c;
}

int64_t comm_allreduce_async(Comm *c, float *buf, int64_t count) {
    return c->be->issue(c, OP_ALLREDUCE, buf, count, 0, COMM_F32);
}

int64_t comm_allreduce_mean_async(Comm *c, void *buf, int64_t count, CommDtype type) {
    return c->be->issue(c, OP_ALLREDUCE_MEAN, buf, count, 0, type);
}

int64_t comm_broadcast_async(Comm *c, float *buf, int64_t count, int root) {
    ASSERT(root >= 0 && root < c->world);
    return c->be->issue(c, OP_BROADCAST, buf, count, root, COMM_F32);
}

void comm_wait(Comm *c) {
    if (c->issued == 0) return;
    c->be->wait(c, c->issued);
}

void comm_wait_op(Comm *c, int64_t id) {
    ASSERT(id >= 0 && id < c->issued && id > c->issued - OPS);
    c->be->wait(c, id + 1);
}

double comm_op_ms(Comm *c, int64_t id) {
    ASSERT(id >= 0 && id < c->issued && id > c->issued - OPS);
    return c->be->op_ms(c, &c->ops[id % OPS], id);
}

void comm_sum_doubles(Comm *c, double *v, int n) {
    if (c->world == 1 || n == 0) return;
    c->be->sum_doubles(c, v, n);
}

void comm_sum_across(void *ctx, double *v, int n) { comm_sum_doubles(ctx, v, n); }

void comm_barrier(Comm *c, const char *what) {
    device_sync(c->dev);
    c->be->drain(c);
    store_barrier(c->store, what);
}

void comm_destroy(Comm *c) {
    if (!c) return;
    comm_barrier(c, "communicator teardown");
    CHECK_PT(pthread_mutex_lock(&c->mu));
    c->stop = 1;
    CHECK_PT(pthread_cond_broadcast(&c->cv));
    CHECK_PT(pthread_mutex_unlock(&c->mu));
    if (c->have_thread) CHECK_PT(pthread_join(c->thread, NULL));
    if (c->be->destroy) c->be->destroy(c);
#ifdef USE_CUDA
    for (int i = 0; i < OPS; i++)
        if (c->ops[i].have_events) {
            cudaEventDestroy(c->ops[i].ready);
            cudaEventDestroy(c->ops[i].start);
            cudaEventDestroy(c->ops[i].end);
        }
    if (c->stream) cudaStreamDestroy(c->stream);
#endif
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
