/* store.c — the rendezvous key-value store: a poll() server thread in rank 0, a blocking client in
 * every rank (see store.h). Sockets come from net.h. */
#include "store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "errors.h"
#include "net.h"

enum { OP_SET = 1, OP_GET = 2, OP_ADD = 3, OP_CHECK = 4 };
#define HDR 12          /* op, 3 pad bytes, key_len, val_len */
#define MAX_CONNS 4096  /* a job of up to ~4000 ranks; more connections are refused */

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static void put_i64(uint8_t *p, int64_t v) {
    put_u32(p, (uint32_t)((uint64_t)v >> 32));
    put_u32(p + 4, (uint32_t)v);
}
static int64_t get_i64(const uint8_t *p) { return (int64_t)((uint64_t)get_u32(p) << 32 | get_u32(p + 4)); }

/* ---- the server (rank 0) --------------------------------------------------------------------- */

typedef struct Entry {
    char *key;
    uint8_t *val;
    uint32_t len;
} Entry;

typedef struct Conn {
    int fd;
    uint8_t *buf; /* bytes received and not yet handled */
    size_t len, cap;
    char *waiting; /* key of a GET that is answered when the key is set */
} Conn;

typedef struct Server {
    int fd;
    int wake[2]; /* a byte written here stops the thread */
    pthread_t thread;
    pthread_mutex_t mu; /* guards n_open (read by store_close) */
    int n_open;
    Entry *kv;
    int n_kv, cap_kv;
    Conn *conns;
    int n_conns, cap_conns;
} Server;

static Entry *kv_find(Server *sv, const char *key) {
    for (int i = 0; i < sv->n_kv; i++)
        if (!strcmp(sv->kv[i].key, key)) return &sv->kv[i];
    return NULL;
}

static Entry *kv_put(Server *sv, const char *key, const uint8_t *val, uint32_t len) {
    Entry *e = kv_find(sv, key);
    if (!e) {
        if (sv->n_kv == sv->cap_kv) {
            sv->cap_kv = sv->cap_kv ? 2 * sv->cap_kv : 64;
            sv->kv = realloc(sv->kv, (size_t)sv->cap_kv * sizeof *sv->kv);
            ASSERT(sv->kv);
        }
        e = &sv->kv[sv->n_kv++];
        e->key = strdup(key);
        e->val = NULL;
    }
    free(e->val);
    e->val = xmalloc(len ? len : 1);
    memcpy(e->val, val, len);
    e->len = len;
    return e;
}

static void conn_close(Server *sv, Conn *c) {
    if (c->fd < 0) return;
    close(c->fd);
    c->fd = -1;
    free(c->buf), free(c->waiting);
    c->buf = NULL, c->waiting = NULL;
    pthread_mutex_lock(&sv->mu);
    sv->n_open--;
    pthread_mutex_unlock(&sv->mu);
}

static void reply(Server *sv, Conn *c, uint8_t status, const uint8_t *val, uint32_t len) {
    uint8_t h[8] = {status};
    put_u32(h + 4, len);
    /* A client that does not read its answer within 10 s is dropped, so one stuck rank cannot
     * stall the server for everyone. */
    if (net_send_all(c->fd, h, 8, 10.0) < 0 || (len && net_send_all(c->fd, val, len, 10.0) < 0))
        conn_close(sv, c);
}

/* A key was set: answer the GETs that were waiting for it. */
static void wake_waiters(Server *sv, const Entry *e) {
    for (int i = 0; i < sv->n_conns; i++) {
        Conn *c = &sv->conns[i];
        if (c->fd >= 0 && c->waiting && !strcmp(c->waiting, e->key)) {
            free(c->waiting);
            c->waiting = NULL;
            reply(sv, c, 1, e->val, e->len);
        }
    }
}

static void handle(Server *sv, Conn *c, int op, const char *key, const uint8_t *val, uint32_t vlen) {
    Entry *e;
    switch (op) {
    case OP_SET:
        e = kv_put(sv, key, val, vlen);
        reply(sv, c, 1, NULL, 0);
        wake_waiters(sv, e);
        break;
    case OP_GET:
        if ((e = kv_find(sv, key))) reply(sv, c, 1, e->val, e->len);
        else c->waiting = strdup(key);
        break;
    case OP_ADD: {
        e = kv_find(sv, key);
        int64_t v = (e && e->len == 8 ? get_i64(e->val) : 0) + get_i64(val);
        uint8_t b[8];
        put_i64(b, v);
        e = kv_put(sv, key, b, 8);
        reply(sv, c, 1, b, 8);
        if (get_i64(val) != 0) wake_waiters(sv, e);
        break;
    }
    case OP_CHECK: reply(sv, c, kv_find(sv, key) ? 1 : 0, NULL, 0); break;
    }
}

/* Read what the connection has sent and handle every complete request in it. */
static void conn_read(Server *sv, Conn *c) {
    if (c->cap - c->len < 4096) {
        c->cap = c->cap ? 2 * c->cap : 8192;
        c->buf = realloc(c->buf, c->cap);
        ASSERT(c->buf);
    }
    ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, MSG_DONTWAIT);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        conn_close(sv, c); /* the rank closed its end (normal at exit) or its connection broke */
        return;
    }
    c->len += (size_t)n;
    while (c->fd >= 0 && c->len >= HDR) {
        int op = c->buf[0];
        uint32_t klen = get_u32(c->buf + 4), vlen = get_u32(c->buf + 8);
        if (op < OP_SET || op > OP_CHECK || klen == 0 || klen > STORE_MAX_KEY || vlen > STORE_MAX_VALUE ||
            (op == OP_ADD && vlen != 8)) {
            fprintf(stderr, "warning: rendezvous store: dropping a connection that sent a malformed or "
                            "oversized request (key %u bytes, value %u bytes; limits %d and %d)\n",
                    klen, vlen, STORE_MAX_KEY, STORE_MAX_VALUE);
            conn_close(sv, c);
            return;
        }
        size_t total = HDR + klen + vlen;
        if (c->len < total) {
            if (c->cap < total) {
                c->cap = total;
                c->buf = realloc(c->buf, c->cap);
                ASSERT(c->buf);
            }
            return; /* the rest of this request is still on its way */
        }
        char key[STORE_MAX_KEY + 1];
        memcpy(key, c->buf + HDR, klen);
        key[klen] = 0;
        handle(sv, c, op, key, c->buf + HDR + klen, vlen);
        if (c->fd < 0) return;
        memmove(c->buf, c->buf + total, c->len - total);
        c->len -= total;
    }
}

static void *server_main(void *arg) {
    Server *sv = arg;
    struct pollfd *pf = NULL;
    int cap_pf = 0;
    for (;;) {
        int n = sv->n_conns;
        if (cap_pf < n + 2) {
            cap_pf = 2 * (n + 2);
            pf = realloc(pf, (size_t)cap_pf * sizeof *pf);
            ASSERT(pf);
        }
        pf[0] = (struct pollfd){.fd = sv->fd, .events = POLLIN};
        pf[1] = (struct pollfd){.fd = sv->wake[0], .events = POLLIN};
        for (int i = 0; i < n; i++) pf[2 + i] = (struct pollfd){.fd = sv->conns[i].fd, .events = POLLIN};
        if (poll(pf, (nfds_t)n + 2, -1) < 0) {
            if (errno == EINTR) continue;
            die_at(__FILE__, __LINE__, "poll", errno_string(), NULL);
        }
        if (pf[1].revents) break;
        for (int i = 0; i < n; i++)
            if (sv->conns[i].fd >= 0 && pf[2 + i].revents) conn_read(sv, &sv->conns[i]);
        /* forget closed connections (their slots only: waiting GETs died with them) */
        int k = 0;
        for (int i = 0; i < sv->n_conns; i++)
            if (sv->conns[i].fd >= 0) sv->conns[k++] = sv->conns[i];
        sv->n_conns = k;
        if (pf[0].revents & POLLIN) {
            int fd = accept4(sv->fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd < 0) continue;
            if (sv->n_conns >= MAX_CONNS) {
                close(fd);
                continue;
            }
            net_nodelay(fd);
            if (sv->n_conns == sv->cap_conns) {
                sv->cap_conns = sv->cap_conns ? 2 * sv->cap_conns : 16;
                sv->conns = realloc(sv->conns, (size_t)sv->cap_conns * sizeof *sv->conns);
                ASSERT(sv->conns);
            }
            sv->conns[sv->n_conns++] = (Conn){.fd = fd};
            pthread_mutex_lock(&sv->mu);
            sv->n_open++;
            pthread_mutex_unlock(&sv->mu);
        }
    }
    free(pf);
    return NULL;
}

static Server *server_start(const char *addr, int port) {
    int fd = net_listen(addr, port, NULL);
    if (fd < 0) {
        if (errno == EADDRINUSE)
            die_user("rank 0 cannot host the rendezvous store on %s:%d: the port is in use (another "
                     "job, or one still shutting down) — pick a free one with --master-port",
                     addr, port);
        if (errno == EADDRNOTAVAIL)
            die_user("rank 0 cannot listen on %s:%d: that is not an address of this machine — "
                     "--master-addr must be an address of the node that runs rank 0 (node 0)",
                     addr, port);
        die_user("rank 0 cannot listen on %s:%d: %s — check --master-addr and --master-port", addr, port,
                 errno_string());
    }
    Server *sv = xcalloc(1, sizeof *sv);
    sv->fd = fd;
    CHECK_SYS(pipe2(sv->wake, O_CLOEXEC));
    xmutex_init(&sv->mu);
    xthread_create(&sv->thread, server_main, sv);
    return sv;
}

static void server_stop(Server *sv) {
    char b = 1;
    if (write(sv->wake[1], &b, 1) != 1) die_at(__FILE__, __LINE__, "write", errno_string(), NULL);
    pthread_join(sv->thread, NULL);
    for (int i = 0; i < sv->n_conns; i++) conn_close(sv, &sv->conns[i]);
    for (int i = 0; i < sv->n_kv; i++) free(sv->kv[i].key), free(sv->kv[i].val);
    close(sv->fd), close(sv->wake[0]), close(sv->wake[1]);
    pthread_mutex_destroy(&sv->mu);
    free(sv->kv), free(sv->conns), free(sv);
}

/* ---- the client (every rank) ----------------------------------------------------------------- */

struct Store {
    int fd;
    int rank, world;
    double timeout;
    char addr[256];
    int port;
    char local_ip[INET6_ADDRSTRLEN];
    Server *server;        /* rank 0 only */
    int64_t barriers;      /* barriers passed: names the next one ("barrier/N") */
    int sequence;          /* store_sequence */
    pthread_mutex_t mu;    /* one request at a time on the connection */
};

_Noreturn static void lost(const Store *s, const char *what) {
    die_runtime("rank %d: the rendezvous store at %s:%d stopped answering during %s (%s) — rank 0, which "
               "hosts it, has probably exited: see its error", s->rank, s->addr, s->port, what,
               errno_string());
}

/* One request and its response. Returns the status; *out gets at most cap value bytes. */
static int request(Store *s, int op, const char *key, const void *val, uint32_t vlen, void *out,
                   size_t cap, size_t *out_len, double timeout) {
    size_t klen = strlen(key);
    ASSERT(klen >= 1 && klen <= STORE_MAX_KEY && vlen <= STORE_MAX_VALUE);
    uint8_t h[HDR] = {(uint8_t)op};
    put_u32(h + 4, (uint32_t)klen);
    put_u32(h + 8, vlen);
    pthread_mutex_lock(&s->mu);
    if (net_send_all(s->fd, h, HDR, timeout) < 0 || net_send_all(s->fd, key, klen, timeout) < 0 ||
        (vlen && net_send_all(s->fd, val, vlen, timeout) < 0))
        lost(s, key);
    uint8_t r[8];
    if (net_recv_all(s->fd, r, 8, timeout) < 0) {
        if (errno == ETIMEDOUT && op == OP_GET)
            die_runtime("rank %d: waited %.0f s for '%s' in the rendezvous store — the rank that should "
                       "publish it (usually rank 0) is slow, hung or failed: see its error",
                       s->rank, timeout, key);
        lost(s, key);
    }
    uint32_t len = get_u32(r + 4);
    if (len > STORE_MAX_VALUE) lost(s, key);
    uint8_t *tmp = xmalloc(len ? len : 1);
    if (len && net_recv_all(s->fd, tmp, len, timeout) < 0) lost(s, key);
    pthread_mutex_unlock(&s->mu);
    if (out) memcpy(out, tmp, len < cap ? len : cap);
    if (out_len) *out_len = len;
    free(tmp);
    return r[0];
}

void store_set(Store *s, const char *key, const void *val, size_t len) {
    if (len > STORE_MAX_VALUE)
        die_at(__FILE__, __LINE__, "store_set", "value larger than STORE_MAX_VALUE", key);
    request(s, OP_SET, key, val, (uint32_t)len, NULL, 0, NULL, s->timeout);
}

size_t store_get(Store *s, const char *key, void *val, size_t cap) {
    size_t len = 0;
    request(s, OP_GET, key, NULL, 0, val, cap, &len, s->timeout);
    return len;
}

void store_wait(Store *s, const char *key) { request(s, OP_GET, key, NULL, 0, NULL, 0, NULL, s->timeout); }

int64_t store_add(Store *s, const char *key, int64_t delta) {
    uint8_t d[8], r[8];
    put_i64(d, delta);
    size_t len = 0;
    request(s, OP_ADD, key, d, 8, r, 8, &len, s->timeout);
    ASSERT(len == 8);
    return get_i64(r);
}

int store_check(Store *s, const char *key) {
    return request(s, OP_CHECK, key, NULL, 0, NULL, 0, NULL, s->timeout);
}

/* Poll a counter until it reaches target (1 ms, doubling to 20 ms between looks). Rendezvous and
 * barriers are rare, so polling is simpler than server-side waiting and cannot leave a request
 * hanging on the connection when we give up. */
static int wait_count(Store *s, const char *key, int64_t target, double timeout) {
    double t_end = time_now() + timeout;
    int pause_us = 1000;
    for (;;) {
        if (store_add(s, key, 0) >= target) return 1;
        if (time_now() > t_end) return 0;
        usleep((useconds_t)pause_us);
        if (pause_us < 20000) pause_us *= 2;
    }
}

/* "rank 3" or "ranks 2, 3, 5" (the first few) for the ranks whose key fmt % r does not exist. */
static int missing_ranks(Store *s, const char *fmt, char *out, size_t cap) {
    int n = 0;
    size_t used = 0;
    char list[512] = "";
    for (int r = 0; r < s->world; r++) {
        char key[64];
        snprintf(key, sizeof key, fmt, r);
        if (store_check(s, key)) continue;
        if (n < 8) used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", n ? ", " : "", r);
        n++;
    }
    if (n > 8) snprintf(list + used, sizeof list - used, " and %d more", n - 8);
    snprintf(out, cap, "%s %s", n == 1 ? "rank" : "ranks", list);
    return n;
}

Store *store_open(const char *addr, int port, int rank, int world, double timeout_s) {
    ASSERT(rank >= 0 && rank < world);
    Store *s = xcalloc(1, sizeof *s);
    s->rank = rank, s->world = world, s->timeout = timeout_s, s->port = port;
    snprintf(s->addr, sizeof s->addr, "%s", addr);
    xmutex_init(&s->mu);
    if (rank == 0) s->server = server_start(addr, port);
    s->fd = net_connect(addr, port, timeout_s);
    if (s->fd < 0)
        die_user("rank %d could not reach the rendezvous store at %s:%d within %.0f s (%s) — check "
                 "--master-addr and --master-port, and that rank 0 (node 0) has started",
                 rank, addr, port, timeout_s, errno_string());
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(s->fd, (struct sockaddr *)&ss, &len);
    if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, s->local_ip, sizeof s->local_ip);
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, s->local_ip, sizeof s->local_ip);

    /* Claim the rank: exactly one process may hold each. */
    char key[64];
    snprintf(key, sizeof key, "rdzv/claim/%d", rank);
    if (store_add(s, key, 1) != 1)
        die_user("two processes claim rank %d of %d — check RANK (or --node-rank and --nproc-per-node) "
                 "on every node", rank, world);
    /* Everyone must agree on the world size: rank 0 publishes its own. */
    int64_t w = world;
    if (rank == 0) store_set(s, "rdzv/world", &w, sizeof w);
    else {
        store_get(s, "rdzv/world", &w, sizeof w);
        if (w != world)
            die_user("rank %d was started with a world size of %d but rank 0 with %lld — start every "
                     "node with the same --nnodes and --nproc-per-node", rank, world, (long long)w);
    }
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(key, sizeof key, "rdzv/host/%d", rank);
    store_set(s, key, host, strlen(host));
    store_add(s, "rdzv/joined", 1);
    if (!wait_count(s, "rdzv/joined", world, timeout_s)) {
        char who[600];
        int n = missing_ranks(s, "rdzv/host/%d", who, sizeof who);
        die_user("%s did not join within %.0f s — check --master-addr (and --master-port, --nnodes, "
                 "--node-rank) on %s", who, timeout_s, n == 1 ? "its node" : "their nodes");
    }
    return s;
}

void store_set_timeout(Store *s, double timeout_s) { s->timeout = timeout_s; }

void store_barrier(Store *s, const char *what) {
    long long n = (long long)s->barriers++;
    char key[64], mine[80];
    snprintf(key, sizeof key, "barrier/%lld", n);
    snprintf(mine, sizeof mine, "barrier/%lld/%d", n, s->rank);
    store_set(s, mine, "", 0);
    store_add(s, key, 1);
    if (!wait_count(s, key, s->world, s->timeout)) {
        char fmt[64], who[600];
        snprintf(fmt, sizeof fmt, "barrier/%lld/%%d", n);
        missing_ranks(s, fmt, who, sizeof who);
        die_runtime("rank %d: %s did not reach the barrier (%s) within %.0f s — slow, hung or failed: see "
                   "their errors", s->rank, who, what, s->timeout);
    }
}

void store_close(Store *s) {
    if (!s) return;
    close(s->fd);
    if (s->server) {
        /* The others may still be reading the last barrier's counter: wait until they hang up. */
        double t_end = time_now() + (s->timeout < 30 ? s->timeout : 30);
        for (;;) {
            pthread_mutex_lock(&s->server->mu);
            int open = s->server->n_open;
            pthread_mutex_unlock(&s->server->mu);
            if (open == 0 || time_now() > t_end) break;
            usleep(2000);
        }
        server_stop(s->server);
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

const char *store_local_ip(const Store *s) { return s->local_ip; }
int store_sequence(Store *s) { return s->sequence++; }
int store_rank(const Store *s) { return s->rank; }
int store_world(const Store *s) { return s->world; }
