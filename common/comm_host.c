/* comm_host.c — the host ring backend: a ring all-reduce and broadcast between the ranks' processes
 * over TCP (net.h), run in order by one communication thread per rank.
 *
 * CPU workers reduce their buffers in place. GPU workers (--comm host) copy each buffer device →
 * pinned host → ring → device on a copy stream of the ring thread, as gloo does for CUDA tensors;
 * that lets several workers share one GPU, which NCCL refuses. comm_wait blocks the caller until
 * the ring thread is done, as gloo's work.wait() does.
 *
 * Each ring connection must prove the job's secret (as the store's clients do, auth.h) before it
 * counts: a ring port is open to every local process during setup, and one that took a neighbour's
 * place could add its own numbers into every rank's sums. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "comm_internal.h"
#include "errors.h"
#include "precision.h"
#include "trace.h"
#include "net.h"

_Static_assert((int)COMM_F16 == (int)PREC_FP16 && (int)COMM_BF16 == (int)PREC_BF16, "CommDtype is a Precision");

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
    /* a mean's contribution: x · fp32(1/world), rounded once to the element type (comm.h) */
    if (op->kind == OP_ALLREDUCE_MEAN && c->world > 1)
        precision_scale_stored((Precision)op->type, op->count, x, 1.0f / (float)c->world);
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

/* ---- setup: the ring's connections and their handshake ---------------------------------------- */

/* Our ring port is open to every process on the machine (and the network) until the left neighbour
 * is in, so each connection runs the store's challenge–response (auth.h) before it counts, with
 * roles that name both ranks — a MAC made for one pair of ranks, or one pair of nonces, is no good
 * for another. For the connection from rank a to its right neighbour b (integers big-endian):
 *
 *   b → a   "RNG1" + sn                                             (36 bytes, when b accepts)
 *   a → b   cn + a:u32 + b:u32 + HMAC(secret, "ring<seq> client <a>><b>" ‖ sn ‖ cn)   (72 bytes)
 *   b → a   HMAC(secret, "ring<seq> server <a>><b>" ‖ sn ‖ cn)      (32 bytes; or b closes it)
 *
 * Every rank is both an a and a b, and a strict order of the two halves would have each rank wait
 * for its neighbour around the ring; so one poll() loop drives both: the connection to the right
 * neighbour and every connection on our port, strangers included, side by side. A stranger that
 * sends something else or nothing within RING_TURN_S is closed with a warning while the real
 * neighbour goes through; only the timeout ends the job. */
#define RING_HELLO "RNG1"
#define RING_ANSWER (AUTH_NONCE + 8 + AUTH_MAC)
#define RING_TURN_S 10.0     /* a connection's time to pass the handshake (half the timeout, if shorter) */
#define RING_MAX_PENDING 16  /* connections in handshake at once; the oldest makes room */
#define RING_MAX_WARNINGS 10 /* refusals reported on stderr per communicator */

typedef struct Pending { /* a connection on our port, not yet proved */
    int fd;
    double since;
    uint8_t sn[AUTH_NONCE];
    uint8_t msg[RING_ANSWER];
    size_t got;
} Pending;

typedef struct Right { /* our connection to the right neighbour, during the handshake */
    uint8_t in[AUTH_HELLO + AUTH_NONCE];
    size_t got, need; /* need: the greeting's 36 bytes, then the MAC's 32; 0 when done */
    uint8_t sn[AUTH_NONCE], cn[AUTH_NONCE];
    const char *ip;
    int port;
} Right;

/* The MAC of the connection from rank a to rank b; role "client" is a's proof, "server" b's. */
static void ring_mac(const Comm *c, int seq, const char *role, int a, int b, const uint8_t *sn, const uint8_t *cn,
                     uint8_t mac[AUTH_MAC]) {
    char label[AUTH_MAX_ROLE + 1];
    snprintf(label, sizeof label, "ring%d %s %d>%d", seq, role, a, b);
    size_t len;
    const uint8_t *secret = store_secret(c->store, &len);
    auth_mac(secret, len, label, sn, cn, mac);
}

static void ring_refuse(const Comm *c, Pending *p, const char *why, int *warnings) {
    if (++*warnings <= RING_MAX_WARNINGS) {
        char peer[64];
        net_peer_name(p->fd, peer, sizeof peer);
        fprintf(stderr, "warning: rank %d: host ring: closed a connection from %s: %s%s\n", c->rank, peer, why,
                *warnings == RING_MAX_WARNINGS ? " (further ones are not reported)" : "");
    }
    close(p->fd);
    p->fd = -1;
}

/* Bytes from the right neighbour: its greeting (answered with our proof), then its proof. */
static void right_step(Comm *c, int seq, Right *rt) {
    int b = (c->rank + 1) % c->world;
    ssize_t n = recv(c->right, rt->in + rt->got, rt->need - rt->got, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0)
        comm_fail(c, "host ring: rank %d closed the connection during the handshake (%s) — it failed (see its "
                     "error), or it refused this rank's proof of the job's secret", b,
                  n == 0 ? "end of stream" : errno_string());
    if ((rt->got += (size_t)n) < rt->need) return;
    if (rt->need == AUTH_MAC) {
        uint8_t want[AUTH_MAC];
        ring_mac(c, seq, "server", c->rank, b, rt->sn, rt->cn, want);
        if (!auth_equal(want, rt->in))
            comm_fail(c, "host ring: the process at %s:%d, the address rank %d published, does not know the job's "
                         "secret — another process holds that port; stop it, or see rank %d's error", rt->ip,
                      rt->port, b, b);
        rt->need = 0;
        return;
    }
    if (memcmp(rt->in, RING_HELLO, AUTH_HELLO))
        comm_fail(c, "host ring: the process at %s:%d, the address rank %d published, did not greet as the host "
                     "ring does — another process holds that port; stop it, or see rank %d's error", rt->ip,
                  rt->port, b, b);
    memcpy(rt->sn, rt->in + AUTH_HELLO, AUTH_NONCE);
    uint8_t msg[RING_ANSWER];
    auth_random(rt->cn, AUTH_NONCE);
    uint32_t ranks[2] = {htonl((uint32_t)c->rank), htonl((uint32_t)b)};
    memcpy(msg, rt->cn, AUTH_NONCE);
    memcpy(msg + AUTH_NONCE, ranks, 8);
    ring_mac(c, seq, "client", c->rank, b, rt->sn, rt->cn, msg + AUTH_NONCE + 8);
    if (net_send_all(c->right, msg, sizeof msg, c->timeout) < 0)
        comm_fail(c, "host ring: sending the handshake to rank %d failed (%s) — it probably failed: see its error",
                  b, errno_string());
    rt->got = 0, rt->need = AUTH_MAC;
}

/* Bytes from a connection on our port. 1 when it has proved it is our left neighbour (it is then
 * c->left), 0 while its answer is incomplete, -1 with why[] when it must be closed. */
static int left_step(Comm *c, int seq, Pending *p, char *why, size_t cap) {
    int a = (c->rank - 1 + c->world) % c->world;
    ssize_t n = recv(p->fd, p->msg + p->got, sizeof p->msg - p->got, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    if (n <= 0) {
        snprintf(why, cap, "it hung up during the handshake (%s)", n == 0 ? "end of stream" : errno_string());
        return -1;
    }
    if ((p->got += (size_t)n) < sizeof p->msg) return 0;
    uint32_t ranks[2];
    memcpy(ranks, p->msg + AUTH_NONCE, 8);
    uint32_t from = ntohl(ranks[0]), to = ntohl(ranks[1]);
    if (from != (uint32_t)a || to != (uint32_t)c->rank) {
        snprintf(why, cap, "it says it is rank %u connecting to rank %u; this port waits for rank %d", from, to, a);
        return -1;
    }
    uint8_t want[AUTH_MAC];
    ring_mac(c, seq, "client", a, c->rank, p->sn, p->msg, want);
    if (!auth_equal(want, p->msg + AUTH_NONCE + 8)) {
        snprintf(why, cap, "it does not know the job's rendezvous secret (STAGE_RDZV_SECRET)");
        return -1;
    }
    ring_mac(c, seq, "server", a, c->rank, p->sn, p->msg, want);
    if (net_send_all(p->fd, want, sizeof want, c->timeout) < 0) {
        snprintf(why, cap, "it hung up before our answer (%s)", errno_string());
        return -1;
    }
    c->left = p->fd;
    return 1;
}

/* A connection on our port: greet it with a fresh nonce. 0, or -1 when it is already gone. */
static int greet(Pending *p) {
    uint8_t hello[AUTH_HELLO + AUTH_NONCE] = RING_HELLO;
    auth_random(p->sn, AUTH_NONCE);
    memcpy(hello + AUTH_HELLO, p->sn, AUTH_NONCE);
    /* an empty send buffer takes 36 bytes at once: never wait on a stranger */
    return send(p->fd, hello, sizeof hello, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof hello ? 0 : -1;
}

/* Ring sockets: listen on the address we reach the store from, publish it, connect to the right
 * neighbour, then run the handshakes (above) until both neighbours have proved themselves.
 * Connecting first cannot deadlock: a connection completes in the kernel's backlog before anyone
 * calls accept. */
static void host_connect(Comm *c, int seq) {
    int R = c->world, r = c->rank, a = (r - 1 + R) % R;
    if (R == 1) return;
    int port, lfd = net_listen(store_local_ip(c->store), 0, &port);
    if (lfd < 0)
        die_at(__FILE__, __LINE__, "net_listen", errno_string(),
               "the host ring needs a free TCP port on this machine");
    /* non-blocking: a connection that is reset between poll() and accept() must not block us */
    CHECK_SYS(fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK));
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

    Right rt = {.need = sizeof rt.in, .ip = ip, .port = rport};
    Pending pend[RING_MAX_PENDING];
    int n = 0, warnings = 0;
    double turn = c->timeout / 2 < RING_TURN_S ? c->timeout / 2 : RING_TURN_S, t_end = time_now() + c->timeout;
    char why[160];
    while (c->left < 0 || rt.need) {
        double now = time_now(), wake = t_end;
        if (now >= t_end) {
            if (c->left < 0)
                comm_fail(c, "host ring: rank %d did not connect and pass the handshake within %.0f s%s — it is "
                             "hung, stopped or failed (see its error)", a, c->timeout,
                          warnings ? " (other connections were refused: see the warnings)" : "");
            comm_fail(c, "host ring: rank %d did not answer the handshake within %.0f s — it is hung, stopped or "
                         "failed (see its error)", (r + 1) % R, c->timeout);
        }
        struct pollfd p[2 + RING_MAX_PENDING] = {{.fd = c->left < 0 ? lfd : -1, .events = POLLIN},
                                                 {.fd = rt.need ? c->right : -1, .events = POLLIN}};
        for (int i = 0; i < n; i++) {
            p[2 + i] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
            if (pend[i].since + turn < wake) wake = pend[i].since + turn;
        }
        int rc = poll(p, (nfds_t)(2 + n), (int)((wake - now) * 1000) + 1);
        if (rc < 0 && errno != EINTR) die_at(__FILE__, __LINE__, "poll", errno_string(), NULL);
        if (rc > 0 && p[1].revents) right_step(c, seq, &rt);
        now = time_now();
        for (int i = 0; i < n; i++) {
            int st = rc > 0 && p[2 + i].revents && c->left < 0 ? left_step(c, seq, &pend[i], why, sizeof why) : 0;
            if (st > 0) pend[i].fd = -1; /* it is c->left now */
            else if (st < 0) ring_refuse(c, &pend[i], why, &warnings);
            else if (c->left >= 0) ring_refuse(c, &pend[i], "the left neighbour passed the handshake first", &warnings);
            else if (now - pend[i].since > turn) {
                snprintf(why, sizeof why, "no handshake within %.0f s", turn);
                ring_refuse(c, &pend[i], why, &warnings);
            }
        }
        int k = 0;
        for (int i = 0; i < n; i++)
            if (pend[i].fd >= 0) pend[k++] = pend[i];
        n = k;
        if (rc <= 0 || c->left >= 0 || !(p[0].revents & POLLIN)) continue;
        Pending q = {.fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC), .since = now};
        if (q.fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
            die_at(__FILE__, __LINE__, "accept", errno_string(), NULL);
        }
        net_nodelay(q.fd);
        if (greet(&q) < 0) {
            ring_refuse(c, &q, "it hung up before the greeting", &warnings);
            continue;
        }
        if (n == RING_MAX_PENDING) { /* the oldest makes room: a real rank finishes in milliseconds */
            ring_refuse(c, &pend[0], "too many connections without a handshake", &warnings);
            memmove(pend, pend + 1, (size_t)(n - 1) * sizeof *pend);
            n--;
        }
        pend[n++] = q;
    }
    for (int i = 0; i < n; i++) /* strangers checked before the neighbour in its last round */
        ring_refuse(c, &pend[i], "the left neighbour passed the handshake first", &warnings);
    close(lfd); /* connections still in its backlog are refused */
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
