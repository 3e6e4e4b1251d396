/* comm.c — the communicator: NCCL with a watchdog, and a host ring all-reduce over TCP run by a
 * communication thread (see comm.h).
 *
 * Both keep a ring of the last OPS operations (what, where, when issued, how long it took), so DDP
 * can read each bucket's all-reduce time a few steps later without synchronising the step. */
#include "comm.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "errors.h"
#include "launch.h"

#ifdef USE_NCCL
#include <nccl.h>
#endif

#define OPS 1024 /* operations remembered; DDP issues at most a few hundred per 3 steps */

typedef enum { OP_ALLREDUCE, OP_BROADCAST, OP_SUM_F64 } OpKind;

typedef struct Op {
    OpKind kind;
    void *buf;      /* device memory (host memory on the CPU backend and for OP_SUM_F64) */
    int64_t count;
    int root;
    double t_issue; /* host time when issued (the watchdog's clock) */
    double ms;      /* host ring: measured by the ring thread */
#ifdef USE_CUDA
    int have_events;
    cudaEvent_t ready; /* on the compute stream: the data is final */
    cudaEvent_t start, end; /* NCCL: on the communication stream around the collective */
#endif
} Op;

struct Comm {
    CommKind kind;
    Store *store;
    Device *dev;
    int rank, world;
    double timeout;
    char desc[96];
    Op ops[OPS];
    int64_t issued, done;   /* operations issued / known complete (in order) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;       /* host ring: the ring thread; NCCL: the watchdog */
    int have_thread, stop;
    /* host ring */
    int left, right;        /* sockets: we receive from rank−1 and send to rank+1 */
    char *scratch;          /* one received chunk */
    size_t scratch_bytes;
    void *staging;          /* GPU workers: the host copy of the buffer being reduced (pinned) */
    size_t staging_bytes;
#ifdef USE_CUDA
    cudaStream_t stream;    /* NCCL's stream, or the ring thread's copy stream */
#endif
#ifdef USE_NCCL
    ncclComm_t nccl;
    double *dscratch;       /* device doubles for comm_sum_doubles */
    double blocking_since;  /* a blocking NCCL call in progress (creation), watched by the watchdog */
    const char *blocking_what;
#endif
};

int comm_have_nccl(void) {
#ifdef USE_NCCL
    return 1;
#else
    return 0;
#endif
}

const char *comm_describe(const Comm *c) { return c->desc; }

/* A failure at run time, usually because another rank failed: mark it as such for the launcher
 * and leave at once. _exit, not exit: another thread may be inside the CUDA runtime, whose exit
 * handlers could then hang. */
_Noreturn static void comm_fail(const Comm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void comm_fail(const Comm *c, const char *fmt, ...) {
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
static Op *op_begin(Comm *c, OpKind kind, void *buf, int64_t count, int root) {
    pthread_mutex_lock(&c->mu);
    while (c->issued - c->done >= OPS) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    Op *op = &c->ops[c->issued % OPS];
    op->kind = kind, op->buf = buf, op->count = count, op->root = root;
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

static int64_t op_publish(Comm *c) {
    pthread_mutex_lock(&c->mu);
    int64_t id = c->issued++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return id;
}

static void wait_done(Comm *c, int64_t upto) {
    pthread_mutex_lock(&c->mu);
    while (c->done < upto) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* ---- the host ring --------------------------------------------------------------------------- */

static size_t chunk_len(int64_t count, int world, int i) {
    return (size_t)(count / world + (i < count % world));
}
static size_t chunk_off(int64_t count, int world, int i) {
    int64_t r = count % world;
    return (size_t)(i * (count / world) + (i < r ? i : r));
}

static void add_f32(void *dst, const void *src, size_t n) {
    float *d = dst;
    const float *s = src;
    for (size_t i = 0; i < n; i++) d[i] += s[i];
}
static void add_f64(void *dst, const void *src, size_t n) {
    double *d = dst;
    const double *s = src;
    for (size_t i = 0; i < n; i++) d[i] += s[i];
}

/* Send sbytes to the right neighbour while receiving rbytes from the left one into rbuf — both at
 * once, or two ranks sending large chunks to each other would each wait for the other to read.
 * With add != NULL the received elements are added into acc as they complete. */
static void ring_exchange(Comm *c, const char *sbuf, size_t sbytes, char *rbuf, size_t rbytes, char *acc,
                          size_t elem, void (*add)(void *, const void *, size_t)) {
    size_t sent = 0, got = 0, added = 0;
    int left_rank = (c->rank - 1 + c->world) % c->world, right_rank = (c->rank + 1) % c->world;
    while (sent < sbytes || got < rbytes) {
        /* a negative fd is ignored by poll: a finished direction must not wake us (POLLHUP) */
        struct pollfd p[2] = {{.fd = sent < sbytes ? c->right : -1, .events = POLLOUT},
                              {.fd = got < rbytes ? c->left : -1, .events = POLLIN}};
        int rc = poll(p, 2, (int)(c->timeout * 1000));
        if (rc < 0 && errno == EINTR) continue;
        if (rc == 0)
            comm_fail(c, "host ring: no progress for %.0f s exchanging with ranks %d and %d — one of them is "
                         "hung or failed (see its error)", c->timeout, left_rank, right_rank);
        if (sent < sbytes && (p[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t n = send(c->right, sbuf + sent, sbytes - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0 && errno != EAGAIN && errno != EINTR)
                comm_fail(c, "host ring: sending to rank %d failed (%s) — it probably failed: see its error",
                          right_rank, errno_string());
            if (n > 0) sent += (size_t)n;
        }
        if (got < rbytes && (p[1].revents & (POLLIN | POLLERR | POLLHUP))) {
            ssize_t n = recv(c->left, rbuf + got, rbytes - got, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
                comm_fail(c, "host ring: the connection from rank %d closed (%s) — it probably failed: see its "
                             "error", left_rank, n == 0 ? "end of stream" : errno_string());
            if (n > 0) got += (size_t)n;
            if (add && got / elem > added) {
                add(acc + added * elem, rbuf + added * elem, got / elem - added);
                added = got / elem;
            }
        }
    }
}

/* In-place SUM all-reduce of count elements at x: reduce-scatter, then all-gather.
 * The array is cut into world chunks (sizes differ by at most one element). In reduce-scatter step
 * s, rank r sends chunk r−s to its right neighbour and adds chunk r−s−1 from its left one into its
 * own; after world−1 steps rank r holds the complete sum of chunk r+1. In all-gather step s it
 * passes chunk r+1−s on and stores chunk r−s. Each rank sends 2·(world−1)/world of the array —
 * the least any all-reduce can — and every rank ends with the same bits (each chunk is summed
 * once, in a fixed order, then copied). */
static void ring_allreduce(Comm *c, void *x, int64_t count, size_t elem) {
    int R = c->world, r = c->rank;
    if (R == 1 || count == 0) return;
    void (*add)(void *, const void *, size_t) = elem == 8 ? add_f64 : add_f32;
    size_t need = chunk_len(count, R, 0) * elem;
    if (need > c->scratch_bytes) {
        free(c->scratch);
        c->scratch = xmalloc(need);
        c->scratch_bytes = need;
    }
    char *b = x;
    for (int s = 0; s < R - 1; s++) {
        int send = ((r - s) % R + R) % R, recv = ((r - s - 1) % R + R) % R;
        ring_exchange(c, b + chunk_off(count, R, send) * elem, chunk_len(count, R, send) * elem, c->scratch,
                      chunk_len(count, R, recv) * elem, b + chunk_off(count, R, recv) * elem, elem, add);
    }
    for (int s = 0; s < R - 1; s++) {
        int send = ((r + 1 - s) % R + R) % R, recv = ((r - s) % R + R) % R;
        ring_exchange(c, b + chunk_off(count, R, send) * elem, chunk_len(count, R, send) * elem,
                      b + chunk_off(count, R, recv) * elem, chunk_len(count, R, recv) * elem, NULL, elem, NULL);
    }
}

/* Broadcast along the ring from root, in 1 MiB pieces so every hop forwards while it receives. */
static void ring_broadcast(Comm *c, void *x, size_t bytes, int root) {
    int R = c->world, pos = ((c->rank - root) % R + R) % R; /* 0 = root, R−1 = last */
    if (R == 1) return;
    const size_t piece = 1 << 20;
    char *b = x;
    for (size_t off = 0; off < bytes; off += piece) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        if (pos > 0 && net_recv_all(c->left, b + off, n, c->timeout) < 0)
            comm_fail(c, "host ring broadcast: receiving from rank %d failed (%s) — it probably failed: see its "
                         "error", (c->rank - 1 + R) % R, errno_string());
        if (pos < R - 1 && net_send_all(c->right, b + off, n, c->timeout) < 0)
            comm_fail(c, "host ring broadcast: sending to rank %d failed (%s) — it probably failed: see its "
                         "error", (c->rank + 1) % R, errno_string());
    }
}

/* One operation on the ring thread: GPU buffers go device → host → ring → device. */
static void host_run(Comm *c, Op *op) {
    size_t elem = op->kind == OP_SUM_F64 ? 8 : 4, bytes = (size_t)op->count * elem;
    void *x = op->buf;
#ifdef USE_CUDA
    int on_gpu = c->dev->kind == DEV_CUDA && op->kind != OP_SUM_F64;
    if (on_gpu) {
        if (bytes > c->staging_bytes) { /* grows during the first steps only */
            if (c->staging) CHECK_CUDA(cudaFreeHost(c->staging));
            CHECK_CUDA(cudaMallocHost(&c->staging, bytes));
            c->staging_bytes = bytes;
        }
        CHECK_CUDA(cudaEventSynchronize(op->ready)); /* backward has produced this bucket */
        CHECK_CUDA(cudaMemcpyAsync(c->staging, op->buf, bytes, cudaMemcpyDeviceToHost, c->stream));
        CHECK_CUDA(cudaStreamSynchronize(c->stream));
        x = c->staging;
    }
#endif
    if (op->kind == OP_BROADCAST) ring_broadcast(c, x, bytes, op->root);
    else ring_allreduce(c, x, op->count, elem);
#ifdef USE_CUDA
    if (on_gpu) {
        CHECK_CUDA(cudaMemcpyAsync(op->buf, c->staging, bytes, cudaMemcpyHostToDevice, c->stream));
        CHECK_CUDA(cudaStreamSynchronize(c->stream));
    }
#endif
}

static void *ring_thread(void *arg) {
    Comm *c = arg;
    device_bind(c->dev);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->done == c->issued) pthread_cond_wait(&c->cv, &c->mu);
        if (c->done == c->issued) break; /* stop, with nothing left to do */
        Op *op = &c->ops[c->done % OPS];
        pthread_mutex_unlock(&c->mu);
        double t0 = time_now();
        host_run(c, op);
        op->ms = 1e3 * (time_now() - t0);
        pthread_mutex_lock(&c->mu);
        c->done++;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Ring sockets: listen on the address we reach the store from, publish it, connect to the right
 * neighbour, accept the left one (which says who it is). Connecting first cannot deadlock: a
 * connection completes in the kernel's backlog before anyone calls accept. */
static void host_connect(Comm *c, int seq) {
    int R = c->world, r = c->rank;
    if (R == 1) return;
    int port, lfd = net_listen(store_local_ip(c->store), 0, &port);
    if (lfd < 0)
        die_at(__FILE__, __LINE__, "net_listen", errno_string(),
               "the host ring needs a free TCP port on this machine");
    char key[64], val[96];
    snprintf(key, sizeof key, "comm%d/ring/%d", seq, r);
    snprintf(val, sizeof val, "%s %d", store_local_ip(c->store), port);
    store_set(c->store, key, val, strlen(val) + 1);
    snprintf(key, sizeof key, "comm%d/ring/%d", seq, (r + 1) % R);
    memset(val, 0, sizeof val);
    store_get(c->store, key, val, sizeof val - 1);
    char ip[80];
    int rport;
    if (sscanf(val, "%79s %d", ip, &rport) != 2) die_at(__FILE__, __LINE__, "sscanf", "bad ring address", val);
    c->right = net_connect(ip, rport, c->timeout);
    if (c->right < 0)
        comm_fail(c, "host ring: cannot connect to rank %d at %s:%d (%s) — is a firewall between the nodes?",
                  (r + 1) % R, ip, rport, errno_string());
    int32_t me = r, who = -1;
    if (net_send_all(c->right, &me, sizeof me, c->timeout) < 0)
        comm_fail(c, "host ring: rank %d closed the connection during setup", (r + 1) % R);
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    if (poll(&p, 1, (int)(c->timeout * 1000)) != 1)
        comm_fail(c, "host ring: rank %d did not connect within %.0f s", (r - 1 + R) % R, c->timeout);
    c->left = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (c->left < 0) die_at(__FILE__, __LINE__, "accept", errno_string(), NULL);
    if (net_recv_all(c->left, &who, sizeof who, c->timeout) < 0 || who != (r - 1 + R) % R)
        comm_fail(c, "host ring: expected rank %d on the left, got %d", (r - 1 + R) % R, who);
    close(lfd);
    /* Larger socket buffers keep the pipe full on loopback and LAN alike. */
    int sz = 4 << 20;
    setsockopt(c->right, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    setsockopt(c->left, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
}

/* ---- NCCL ------------------------------------------------------------------------------------ */

#ifdef USE_NCCL
static const char *nccl_why(ncclResult_t r) {
    static __thread char buf[512];
    const char *last = ncclGetLastError(NULL);
    snprintf(buf, sizeof buf, "%s%s%s", ncclGetErrorString(r), last && last[0] ? ": " : "", last ? last : "");
    return buf;
}
static const char *nccl_hint(ncclResult_t r) {
    switch (r) {
    case ncclInvalidUsage:
        return "every NCCL rank needs its own GPU: use one worker per GPU, or --comm host to share GPUs";
    case ncclSystemError:
    case ncclRemoteError:
        return "a peer failed, or the network / NVLink is unusable; NCCL_DEBUG=WARN says more";
    default:
        return "NCCL_DEBUG=WARN ./stage3 … says more";
    }
}
#define CHECK_NCCL(call)                                                                           \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess) die_at(__FILE__, __LINE__, #call, nccl_why(r_), nccl_hint(r_));     \
    } while (0)

static const char *op_name(OpKind k) {
    return k == OP_ALLREDUCE ? "all-reduce" : k == OP_BROADCAST ? "broadcast" : "sum of doubles";
}

_Noreturn static void watchdog_fail(Comm *c, const char *what) {
    fflush(stdout);
    fprintf(stderr, "error: rank %d: %s; aborting the NCCL communicator\n", c->rank, what);
    fflush(stderr);
    launch_mark_collateral();
    if (c->nccl) ncclCommAbort(c->nccl); /* unblocks every kernel and call of this communicator */
    _exit(1);
}

/* The watchdog: every 20 ms, NCCL's asynchronous error, then the oldest unfinished operation's age.
 * NCCL reports a dead peer as an asynchronous error (or not at all: the kernel just waits), so
 * without this a failure elsewhere would hang this rank forever. */
static void *nccl_watchdog(void *arg) {
    Comm *c = arg;
    device_bind(c->dev);
    char msg[1024];
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int stop = c->stop;
        int64_t issued = c->issued, done = c->done;
        ncclComm_t nc = c->nccl;
        const char *blocking = c->blocking_what;
        double since = c->blocking_since;
        pthread_mutex_unlock(&c->mu);
        if (stop) break;
        if (nc) {
            ncclResult_t ae = ncclSuccess;
            if (ncclCommGetAsyncError(nc, &ae) == ncclSuccess && ae != ncclSuccess && ae != ncclInProgress) {
                snprintf(msg, sizeof msg, "NCCL reported an asynchronous error: %s", nccl_why(ae));
                watchdog_fail(c, msg);
            }
        }
        while (done < issued) {
            cudaError_t e = cudaEventQuery(c->ops[done % OPS].end);
            if (e == cudaErrorNotReady) break;
            if (e == cudaErrorCudartUnloading) return NULL; /* the process is exiting (its own error) */
            if (e != cudaSuccess) {
                snprintf(msg, sizeof msg, "CUDA error on the communication stream: %s", cudaGetErrorString(e));
                watchdog_fail(c, msg);
            }
            done++;
        }
        pthread_mutex_lock(&c->mu);
        c->done = done;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        double now = time_now();
        if (done < issued && now - c->ops[done % OPS].t_issue > c->timeout) {
            Op *op = &c->ops[done % OPS];
            snprintf(msg, sizeof msg, "NCCL %s #%lld of %lld floats has not completed %.0f s after it was "
                     "issued — another rank is hung or failed (see its error), or --comm-timeout is too short",
                     op_name(op->kind), (long long)done, (long long)op->count, now - op->t_issue);
            watchdog_fail(c, msg);
        }
        if (blocking && now - since > c->timeout) {
            snprintf(msg, sizeof msg, "%s has not returned after %.0f s — another rank did not get there",
                     blocking, now - since);
            watchdog_fail(c, msg);
        }
        usleep(20000);
    }
    return NULL;
}

static void nccl_create(Comm *c, int seq) {
    int v = 0;
    ncclGetVersion(&v);
    snprintf(c->desc, sizeof c->desc, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    device_bind(c->dev);
    int lo, hi;
    CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    /* High priority: when a bucket is ready, its all-reduce gets SMs as soon as backward's kernels
     * free some, instead of queueing behind them. */
    CHECK_CUDA(cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking, hi));
    c->dscratch = device_alloc(c->dev, 512 * sizeof(double), "nccl scratch");
    ncclUniqueId id;
    char key[64];
    snprintf(key, sizeof key, "comm%d/nccl_id", seq);
    if (c->rank == 0) {
        CHECK_NCCL(ncclGetUniqueId(&id));
        store_set(c->store, key, &id, sizeof id);
    } else if (store_get(c->store, key, &id, sizeof id) != sizeof id) {
        die_at(__FILE__, __LINE__, "store_get", "NCCL unique id of the wrong size", key);
    }
    /* Creation blocks until every rank has joined; the watchdog bounds it. */
    pthread_mutex_lock(&c->mu);
    c->blocking_what = "ncclCommInitRank", c->blocking_since = time_now();
    pthread_mutex_unlock(&c->mu);
    ncclComm_t nc;
    CHECK_NCCL(ncclCommInitRank(&nc, c->world, id, c->rank));
    pthread_mutex_lock(&c->mu);
    c->nccl = nc, c->blocking_what = NULL;
    pthread_mutex_unlock(&c->mu);
}

static int64_t nccl_issue(Comm *c, OpKind kind, float *buf, int64_t count, int root) {
    Op *op = op_begin(c, kind, buf, count, root);
    Device *d = c->dev;
    /* The comm stream waits for the compute stream (the bucket is final); the host does not. */
    CHECK_CUDA(cudaEventRecord(op->ready, d->stream));
    CHECK_CUDA(cudaStreamWaitEvent(c->stream, op->ready, 0));
    CHECK_CUDA(cudaEventRecord(op->start, c->stream));
    if (kind == OP_ALLREDUCE)
        CHECK_NCCL(ncclAllReduce(buf, buf, (size_t)count, ncclFloat, ncclSum, c->nccl, c->stream));
    else
        CHECK_NCCL(ncclBroadcast(buf, buf, (size_t)count, ncclFloat, root, c->nccl, c->stream));
    CHECK_CUDA(cudaEventRecord(op->end, c->stream));
    return op_publish(c);
}
#endif

/* ---- the interface --------------------------------------------------------------------------- */

Comm *comm_create(CommKind kind, Store *store, Device *dev, double timeout_s) {
    Comm *c = xcalloc(1, sizeof *c);
    c->kind = kind, c->store = store, c->dev = dev, c->timeout = timeout_s;
    c->rank = store_rank(store), c->world = store_world(store);
    c->left = c->right = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    int seq = store_sequence(store); /* names this communicator's keys in the store */
    if (kind == COMM_NCCL) {
#ifdef USE_NCCL
        if (dev->kind != DEV_CUDA) die_user("--comm nccl needs GPU workers; CPU workers use --comm host");
        /* NVLink SHARP (multicast) buys nothing for DDP's all-reduce over a few GPUs, and on shared
         * hosts it can leave GPUs unusable: off unless the user asks for it (set before any thread). */
        setenv("NCCL_NVLS_ENABLE", "0", 0);
        int rc = pthread_create(&c->thread, NULL, nccl_watchdog, c);
        if (rc) die_at(__FILE__, __LINE__, "pthread_create", strerror(rc), NULL);
        c->have_thread = 1;
        nccl_create(c, seq);
#else
        die_user("--comm nccl: this binary was built without NCCL — install NCCL 2 (or set NCCL_HOME) and "
                 "rebuild, or use --comm host");
#endif
        return c;
    }
    snprintf(c->desc, sizeof c->desc, "host ring over TCP (%s)", store_local_ip(store));
#ifdef USE_CUDA
    if (dev->kind == DEV_CUDA) {
        device_bind(dev);
        CHECK_CUDA(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    }
#endif
    host_connect(c, seq);
    int rc = pthread_create(&c->thread, NULL, ring_thread, c);
    if (rc) die_at(__FILE__, __LINE__, "pthread_create", strerror(rc), NULL);
    c->have_thread = 1;
    return c;
}

static int64_t host_issue(Comm *c, OpKind kind, void *buf, int64_t count, int root) {
    Op *op = op_begin(c, kind, buf, count, root);
#ifdef USE_CUDA
    if (c->dev->kind == DEV_CUDA && kind != OP_SUM_F64) CHECK_CUDA(cudaEventRecord(op->ready, c->dev->stream));
#else
    (void)op;
#endif
    return op_publish(c);
}

int64_t comm_allreduce_async(Comm *c, float *buf, int64_t count) {
#ifdef USE_NCCL
    if (c->kind == COMM_NCCL) return nccl_issue(c, OP_ALLREDUCE, buf, count, 0);
#endif
    return host_issue(c, OP_ALLREDUCE, buf, count, 0);
}

int64_t comm_broadcast_async(Comm *c, float *buf, int64_t count, int root) {
    ASSERT(root >= 0 && root < c->world);
#ifdef USE_NCCL
    if (c->kind == COMM_NCCL) return nccl_issue(c, OP_BROADCAST, buf, count, root);
#endif
    return host_issue(c, OP_BROADCAST, buf, count, root);
}

void comm_wait(Comm *c) {
    if (c->issued == 0) return;
#ifdef USE_NCCL
    if (c->kind == COMM_NCCL) {
        /* The comm stream runs its operations in order: waiting for the last one waits for all. */
        CHECK_CUDA(cudaStreamWaitEvent(c->dev->stream, c->ops[(c->issued - 1) % OPS].end, 0));
        return;
    }
#endif
    /* The ring thread synchronised its last host → device copy before marking it done. */
    wait_done(c, c->issued);
}

double comm_op_ms(Comm *c, int64_t id) {
    ASSERT(id >= 0 && id < c->issued && id > c->issued - OPS);
    Op *op = &c->ops[id % OPS];
#ifdef USE_NCCL
    if (c->kind == COMM_NCCL) {
        float ms = 0;
        CHECK_CUDA(cudaEventSynchronize(op->end));
        CHECK_CUDA(cudaEventElapsedTime(&ms, op->start, op->end));
        return ms;
    }
#endif
    wait_done(c, id + 1);
    return op->ms;
}

void comm_sum_doubles(Comm *c, double *v, int n) {
    if (c->world == 1 || n == 0) return;
#ifdef USE_NCCL
    if (c->kind == COMM_NCCL) {
        ASSERT(n <= 512);
        Op *op = op_begin(c, OP_SUM_F64, v, n, 0);
        size_t bytes = (size_t)n * sizeof(double);
        CHECK_CUDA(cudaEventRecord(op->start, c->stream));
        CHECK_CUDA(cudaMemcpyAsync(c->dscratch, v, bytes, cudaMemcpyHostToDevice, c->stream));
        CHECK_NCCL(ncclAllReduce(c->dscratch, c->dscratch, (size_t)n, ncclDouble, ncclSum, c->nccl, c->stream));
        CHECK_CUDA(cudaEventRecord(op->end, c->stream));
        op_publish(c); /* published before we block below, so the watchdog bounds the wait */
        CHECK_CUDA(cudaMemcpyAsync(v, c->dscratch, bytes, cudaMemcpyDeviceToHost, c->stream));
        CHECK_CUDA(cudaStreamSynchronize(c->stream));
        return;
    }
#endif
    host_issue(c, OP_SUM_F64, v, n, 0);
    wait_done(c, c->issued);
}

void comm_sum_across(void *ctx, double *v, int n) { comm_sum_doubles(ctx, v, n); }

void comm_barrier(Comm *c, const char *what) {
    device_sync(c->dev);
#ifdef USE_CUDA
    if (c->kind == COMM_NCCL) CHECK_CUDA(cudaStreamSynchronize(c->stream));
#endif
    if (c->kind == COMM_HOST) wait_done(c, c->issued);
    store_barrier(c->store, what);
}

void comm_destroy(Comm *c) {
    if (!c) return;
    comm_barrier(c, "communicator teardown");
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->have_thread) pthread_join(c->thread, NULL);
#ifdef USE_NCCL
    if (c->nccl) CHECK_NCCL(ncclCommDestroy(c->nccl));
    if (c->dscratch) device_free(c->dev, c->dscratch);
#endif
#ifdef USE_CUDA
    for (int i = 0; i < OPS; i++)
        if (c->ops[i].have_events) {
            cudaEventDestroy(c->ops[i].ready);
            cudaEventDestroy(c->ops[i].start);
            cudaEventDestroy(c->ops[i].end);
        }
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->staging) cudaFreeHost(c->staging);
#endif
    if (c->left >= 0) close(c->left);
    if (c->right >= 0) close(c->right);
    free(c->scratch);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
