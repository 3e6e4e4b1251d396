/* comm_host.c — the host ring backend: a ring all-reduce and broadcast between the ranks' processes
 * over TCP (net.h), run in order by one communication thread per rank.
 *
 * CPU workers reduce their buffers in place. GPU workers (--comm host) copy each buffer device →
 * pinned host → ring → device on a copy stream of the ring thread, as gloo does for CUDA tensors;
 * that lets several workers share one GPU, which NCCL refuses. comm_wait blocks the caller until
 * the ring thread is done, as gloo's work.wait() does. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm_internal.h"
#include "errors.h"
#include "precision.h"
#include "trace.h"
#include "net.h"

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
/* 16-bit sums: widen, add in fp32, round back — every addition rounded to the type, as NCCL's. */
static void add_f16(void *dst, const void *src, size_t n) {
    uint16_t *d = dst;
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) d[i] = f32_to_f16(f16_to_f32(d[i]) + f16_to_f32(s[i]));
}
static void add_bf16(void *dst, const void *src, size_t n) {
    uint16_t *d = dst;
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(bf16_to_f32(d[i]) + bf16_to_f32(s[i]));
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
        if (rc == 0) /* name the one we wait for: the left one has not sent, or the right one not read */
            comm_fail(c, "host ring: no progress for %.0f s: rank %d stopped answering (it has not %s) — it is "
                         "hung, stopped or failed (see its error)", c->timeout, got < rbytes ? left_rank : right_rank,
                      got < rbytes ? "sent its part" : "read ours");
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
static void ring_allreduce(Comm *c, void *x, int64_t count, const Op *op) {
    int R = c->world, r = c->rank;
    if (R == 1 || count == 0) return;
    size_t elem = comm_op_elem(op);
    void (*add)(void *, const void *, size_t) = op->kind == OP_SUM_F64  ? add_f64
                                                : op->type == COMM_F16 ? add_f16
                                                : op->type == COMM_BF16 ? add_bf16
                                                                        : add_f32;
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

/* x *= 1/world, in the all-reduce's element type: a mean all-reduce's contribution (what ncclAvg
 * does on the device). */
static void premultiply(void *x, int64_t count, CommDtype type, int world) {
    const float s = 1.0f / (float)world;
    if (type == COMM_F32)
        for (int64_t i = 0; i < count; i++) ((float *)x)[i] *= s;
    else if (type == COMM_F16)
        for (int64_t i = 0; i < count; i++) ((uint16_t *)x)[i] = f32_to_f16(f16_to_f32(((uint16_t *)x)[i]) * s);
    else
        for (int64_t i = 0; i < count; i++) ((uint16_t *)x)[i] = f32_to_bf16(bf16_to_f32(((uint16_t *)x)[i]) * s);
}

/* One operation on the ring thread: GPU buffers go device → host → ring → device. */
static void host_run(Comm *c, Op *op) {
    size_t bytes = (size_t)op->count * comm_op_elem(op);
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
    if (op->kind == OP_ALLREDUCE_MEAN && c->world > 1) premultiply(x, op->count, op->type, c->world);
    if (op->kind == OP_BROADCAST) ring_broadcast(c, x, bytes, op->root);
    else ring_allreduce(c, x, op->count, op);
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
    trace_thread_name("comm ring thread (all-reduce)");
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->done == c->issued) pthread_cond_wait(&c->cv, &c->mu);
        if (c->done == c->issued) break; /* stop, with nothing left to do */
        Op *op = &c->ops[c->done % OPS];
        pthread_mutex_unlock(&c->mu);
        double t0 = time_now();
        TraceSpan span = trace_begin(op->kind == OP_BROADCAST ? "broadcast" : op->kind == OP_SUM_F64 ? "sum" : "all-reduce",
                                     "comm", op->count);
        host_run(c, op);
        trace_end(span);
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

static int64_t host_issue_any(Comm *c, OpKind kind, void *buf, int64_t count, int root, CommDtype type) {
    Op *op = comm_op_begin(c, kind, buf, count, root, type);
#ifdef USE_CUDA
    if (c->dev->kind == DEV_CUDA && kind != OP_SUM_F64) CHECK_CUDA(cudaEventRecord(op->ready, c->dev->stream));
#else
    (void)op;
#endif
    return comm_op_publish(c);
}

static void host_create(Comm *c, int seq) {
    snprintf(c->desc, sizeof c->desc, "host ring over TCP (%s)", store_local_ip(c->store));
#ifdef USE_CUDA
    if (c->dev->kind == DEV_CUDA) {
        device_bind(c->dev);
        CHECK_CUDA(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    }
#endif
    host_connect(c, seq);
    xthread_create(&c->thread, ring_thread, c);
    c->have_thread = 1;
}

static int64_t host_issue(Comm *c, OpKind kind, void *buf, int64_t count, int root, CommDtype type) {
    return host_issue_any(c, kind, buf, count, root, type);
}

/* The ring thread synchronised its last host → device copy before marking it done. */
static void host_wait(Comm *c, int64_t upto) { comm_wait_done(c, upto); }

static void host_drain(Comm *c) { comm_wait_done(c, c->issued); }

static double host_op_ms(Comm *c, Op *op, int64_t id) {
    comm_wait_done(c, id + 1);
    return op->ms;
}

static void host_sum_doubles(Comm *c, double *v, int n) {
    host_issue_any(c, OP_SUM_F64, v, n, 0, COMM_F32);
    comm_wait_done(c, c->issued);
}

static void host_destroy(Comm *c) {
#ifdef USE_CUDA
    if (c->staging) cudaFreeHost(c->staging);
#endif
    if (c->left >= 0) close(c->left);
    if (c->right >= 0) close(c->right);
    free(c->scratch);
}

const CommOps comm_host_ops = {
    .create = host_create,
    .issue = host_issue,
    .wait = host_wait,
    .op_ms = host_op_ms,
    .sum_doubles = host_sum_doubles,
    .drain = host_drain,
    .destroy = host_destroy,
};
