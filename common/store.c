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
#include "auth.h"
#include "net.h"
#include "worker_status.h" /* die_collateral */

enum { OP_SET = 1, OP_GET = 2, OP_ADD = 3, OP_CHECK = 4 };
enum { STATUS_OVERFLOW = 2 }; /* ADD would leave the int64 range */
#define HDR 12          /* op, 3 pad bytes, key_len, val_len */
#define MAX_CONNS (STORE_MAX_WORLD + MAX_STRANGERS) /* every rank, and strangers; more are refused */

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

/* Limits that keep one bad or slow client from stalling or growing the server:
 *  - a connection is a stranger until it passes the handshake (auth.h): it may hold 64 bytes, and
 *    is closed after AUTH_TIMEOUT_S; at most MAX_STRANGERS wait at once (the oldest goes first);
 *  - replies never block: they wait in the connection's own buffer, and a client that leaves one
 *    unread, or a request half-sent, for STALL_S is closed;
 *  - a connection holds one request and one reply at a time (a client that sends another before
 *    reading its answer is closed), and all buffers together stay under MAX_BUFFERED.
 * A rank that idles between barriers for hours is fine: only strangers and stalls are timed out. */
#define AUTH_TIMEOUT_S 10.0 /* at most: the rendezvous timeout, if shorter (but 2 s at least) */
#define STALL_S 30.0        /* the same: at most, and 5 s at least */
#define MAX_STRANGERS 64
#define MAX_BUFFERED ((size_t)64 << 20)
#define MAX_WARNINGS 10 /* refusals reported on stderr; later ones are only counted */

typedef struct Entry {
    char *key;
    uint8_t *val;
    uint32_t len;
} Entry;

typedef struct Conn {
    int fd;                     /* -1: closed; FUZZ_FD: no socket (store_fuzz_input) */
    int authed;
    double since;               /* accepted, or first byte of a pending request / reply */
    uint8_t nonce[AUTH_NONCE];  /* the server's challenge */
    uint8_t hello[AUTH_NONCE + AUTH_MAC];
    size_t hello_len;
    uint8_t *in;                /* bytes of the request being received */
    size_t in_len, in_cap;
    uint8_t *out;               /* the reply not yet sent */
    size_t out_len, out_off;
    char *waiting;              /* key of a GET that is answered when the key is set */
} Conn;
#define FUZZ_FD (-2)

typedef struct Server {
    int fd;
    int wake[2]; /* a byte written here stops the thread */
    pthread_t thread;
    pthread_mutex_t mu; /* guards n_open (read by store_close) */
    int n_open;         /* authenticated connections: the job's ranks */
    uint8_t secret[AUTH_MAX_SECRET];
    size_t secret_len;
    double auth_timeout, stall; /* AUTH_TIMEOUT_S and STALL_S for this job */
    size_t buffered;    /* bytes held in every connection's in and out buffers */
    int warnings;
    Entry *kv;
    int n_kv, cap_kv;
    Conn *conns;
    int n_conns, cap_conns;
} Server;

static void warn(Server *sv, const Conn *c, const char *why) {
    if (++sv->warnings > MAX_WARNINGS) return;
    char peer[INET6_ADDRSTRLEN];
    net_peer_name(c->fd, peer, sizeof peer);
    fprintf(stderr, "warning: rendezvous store: closed a connection from %s: %s%s\n", peer, why,
            sv->warnings == MAX_WARNINGS ? " (further ones are not reported)" : "");
}

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
            sv->kv = xrealloc(sv->kv, (size_t)sv->cap_kv * sizeof *sv->kv);
        }
        e = &sv->kv[sv->n_kv++];
        e->key = xstrdup(key);
        e->val = NULL;
    }
    free(e->val);
    e->val = xmalloc(len ? len : 1);
    memcpy(e->val, val, len);
    e->len = len;
    return e;
}

static void conn_close(Server *sv, Conn *c) {
    if (c->fd == -1) return;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    sv->buffered -= c->in_cap + c->out_len;
    free(c->in), free(c->out), free(c->waiting);
    c->in = c->out = NULL, c->waiting = NULL;
    c->in_cap = c->in_len = c->out_len = c->out_off = 0;
    if (c->authed) {
        pthread_mutex_lock(&sv->mu);
        sv->n_open--;
        pthread_mutex_unlock(&sv->mu);
    }
}

/* Send what the socket takes now; the rest waits for POLLOUT. */
static void conn_flush(Server *sv, Conn *c) {
    while (c->fd != -1 && c->out_off < c->out_len) {
        if (c->fd == FUZZ_FD) {
            c->out_off = c->out_len;
            break;
        }
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            conn_close(sv, c);
            return;
        }
        c->out_off += (size_t)n;
    }
    if (c->fd != -1 && c->out_len) {
        sv->buffered -= c->out_len;
        free(c->out);
        c->out = NULL, c->out_len = c->out_off = 0;
    }
}

static void queue(Server *sv, Conn *c, const uint8_t *h, size_t hlen, const uint8_t *val, size_t len) {
    ASSERT(c->out_len == 0);
    if (sv->buffered + hlen + len > MAX_BUFFERED) {
        warn(sv, c, "the store's reply buffers are full");
        conn_close(sv, c);
        return;
    }
    c->out = xmalloc(hlen + len);
    memcpy(c->out, h, hlen);
    if (len) memcpy(c->out + hlen, val, len);
    c->out_len = hlen + len, c->out_off = 0;
    sv->buffered += c->out_len;
    c->since = time_now();
    conn_flush(sv, c);
}

static void reply(Server *sv, Conn *c, uint8_t status, const uint8_t *val, uint32_t len) {
    uint8_t h[8] = {status};
    put_u32(h + 4, len);
    queue(sv, c, h, 8, val, len);
}

/* A key was set: answer the GETs that were waiting for it. */
static void wake_waiters(Server *sv, const Entry *e) {
    for (int i = 0; i < sv->n_conns; i++) {
        Conn *c = &sv->conns[i];
        if (c->fd != -1 && c->waiting && !strcmp(c->waiting, e->key)) {
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
        else {
            c->waiting = xstrdup(key);
        }
        break;
    case OP_ADD: {
        e = kv_find(sv, key);
        int created = !e; /* ADD 0 on a missing key creates it: a GET waiting for it must wake too */
        int64_t v, delta = get_i64(val), old = e && e->len == 8 ? get_i64(e->val) : 0;
        if (__builtin_add_overflow(old, delta, &v)) { /* answered, the counter left as it was */
            reply(sv, c, STATUS_OVERFLOW, NULL, 0);
            break;
        }
        uint8_t b[8];
        put_i64(b, v);
        e = kv_put(sv, key, b, 8);
        reply(sv, c, 1, b, 8);
        if (delta != 0 || created) wake_waiters(sv, e);
        break;
    }
    case OP_CHECK: reply(sv, c, kv_find(sv, key) ? 1 : 0, NULL, 0); break;
    }
}

/* The client's half of the handshake has arrived: check it, answer with ours, or close. */
static void conn_hello(Server *sv, Conn *c) {
    uint8_t want[AUTH_MAC];
    auth_mac(sv->secret, sv->secret_len, "client", c->nonce, c->hello, want);
    if (!auth_equal(want, c->hello + AUTH_NONCE)) {
        warn(sv, c, "it does not know the job's rendezvous secret (STAGE_RDZV_SECRET)");
        conn_close(sv, c);
        return;
    }
    c->authed = 1;
    pthread_mutex_lock(&sv->mu);
    sv->n_open++;
    pthread_mutex_unlock(&sv->mu);
    uint8_t mac[AUTH_MAC];
    auth_mac(sv->secret, sv->secret_len, "server", c->nonce, c->hello, mac);
    queue(sv, c, mac, AUTH_MAC, NULL, 0);
}

/* The size of the request whose header is in c->in, or 0 (the connection closed) when it is invalid. */
static size_t request_size(Server *sv, Conn *c) {
    int op = c->in[0];
    uint32_t klen = get_u32(c->in + 4), vlen = get_u32(c->in + 8);
    if (op < OP_SET || op > OP_CHECK || klen == 0 || klen > STORE_MAX_KEY || vlen > STORE_MAX_VALUE ||
        (op == OP_ADD && vlen != 8) || (op != OP_SET && op != OP_ADD && vlen != 0)) {
        char why[160];
        snprintf(why, sizeof why, "a malformed or oversized request (op %d, key %u bytes, value %u bytes; "
                 "limits %d and %d)", op, klen, vlen, STORE_MAX_KEY, STORE_MAX_VALUE);
        warn(sv, c, why);
        conn_close(sv, c);
        return 0;
    }
    return HDR + klen + vlen;
}

/* Bytes that arrived on a connection: the handshake first, then one request at a time. */
static void conn_input(Server *sv, Conn *c, const uint8_t *data, size_t n) {
    while (n > 0 && c->fd != -1) {
        if (c->out_len || c->waiting) { /* one request at a time: this one is not answered yet */
            warn(sv, c, "it sent a request before reading the answer to its last");
            conn_close(sv, c);
            return;
        }
        if (!c->authed) {
            size_t take = sizeof c->hello - c->hello_len;
            if (take > n) take = n;
            memcpy(c->hello + c->hello_len, data, take);
            c->hello_len += take, data += take, n -= take;
            if (c->hello_len == sizeof c->hello) conn_hello(sv, c);
            continue;
        }
        if (c->in_len == 0) c->since = time_now();
        /* What this request needs: its header, then exactly the size the header declares. */
        size_t need = c->in_len >= HDR ? request_size(sv, c) : HDR;
        if (!need) return;
        if (c->in_cap < need) {
            if (sv->buffered + need - c->in_cap > MAX_BUFFERED) {
                warn(sv, c, "the store's request buffers are full");
                conn_close(sv, c);
                return;
            }
            c->in = xrealloc(c->in, need);
            sv->buffered += need - c->in_cap;
            c->in_cap = need;
        }
        size_t take = need - c->in_len;
        if (take > n) take = n;
        memcpy(c->in + c->in_len, data, take);
        c->in_len += take, data += take, n -= take;
        if (c->in_len == HDR && !(need = request_size(sv, c))) return; /* a bad header: refuse it at once */
        if (c->in_len < need) continue;
        uint32_t klen = get_u32(c->in + 4), vlen = get_u32(c->in + 8);
        char key[STORE_MAX_KEY + 1];
        memcpy(key, c->in + HDR, klen);
        key[klen] = 0;
        c->in_len = 0;
        handle(sv, c, c->in[0], key, c->in + HDR + klen, vlen);
        /* a big request's buffer goes back; small ones keep theirs */
        if (c->fd != -1 && c->in_cap > 4096) {
            sv->buffered -= c->in_cap;
            free(c->in);
            c->in = NULL, c->in_cap = 0;
        }
    }
}

static void conn_read(Server *sv, Conn *c) {
    uint8_t b[65536];
    ssize_t n = recv(c->fd, b, sizeof b, MSG_DONTWAIT);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
        conn_close(sv, c); /* the rank closed its end (normal at exit) or its connection broke */
        return;
    }
    conn_input(sv, c, b, (size_t)n);
}

/* Close strangers that did not finish the handshake in time and clients that stalled mid-message. */
static void conn_deadlines(Server *sv, Conn *c, double now) {
    if (c->fd == -1) return;
    if (!c->authed && now - c->since > sv->auth_timeout) warn(sv, c, "no handshake in time"), conn_close(sv, c);
    else if (c->out_len && now - c->since > sv->stall) warn(sv, c, "it left an answer unread"), conn_close(sv, c);
    else if (c->in_len && now - c->since > sv->stall) warn(sv, c, "it sent half a request and stopped"), conn_close(sv, c);
}

static void conn_accept(Server *sv) {
    int fd = accept4(sv->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) return;
    if (sv->n_conns >= MAX_CONNS) {
        close(fd);
        return;
    }
    /* Too many strangers at once: the oldest makes room (a real rank finishes its handshake in ms). */
    int strangers = 0, oldest = -1;
    for (int i = 0; i < sv->n_conns; i++)
        if (sv->conns[i].fd != -1 && !sv->conns[i].authed) {
            strangers++;
            if (oldest < 0 || sv->conns[i].since < sv->conns[oldest].since) oldest = i;
        }
    if (strangers >= MAX_STRANGERS) warn(sv, &sv->conns[oldest], "too many connections without a handshake"),
                                    conn_close(sv, &sv->conns[oldest]);
    net_nodelay(fd);
    if (sv->n_conns == sv->cap_conns) {
        sv->cap_conns = sv->cap_conns ? 2 * sv->cap_conns : 16;
        sv->conns = xrealloc(sv->conns, (size_t)sv->cap_conns * sizeof *sv->conns);
    }
    Conn *c = &sv->conns[sv->n_conns++];
    *c = (Conn){.fd = fd, .since = time_now()};
    auth_random(c->nonce, AUTH_NONCE);
    uint8_t hello[AUTH_HELLO + AUTH_NONCE] = "RDZ1";
    memcpy(hello + AUTH_HELLO, c->nonce, AUTH_NONCE);
    queue(sv, c, hello, sizeof hello, NULL, 0);
}

static void forget_closed(Server *sv) {
    int k = 0;
    for (int i = 0; i < sv->n_conns; i++)
        if (sv->conns[i].fd != -1) sv->conns[k++] = sv->conns[i];
    sv->n_conns = k;
}

static void *server_main(void *arg) {
    Server *sv = arg;
    struct pollfd *pf = NULL;
    int cap_pf = 0;
    for (;;) {
        int n = sv->n_conns;
        if (cap_pf < n + 2) {
            cap_pf = 2 * (n + 2);
            pf = xrealloc(pf, (size_t)cap_pf * sizeof *pf);
        }
        pf[0] = (struct pollfd){.fd = sv->fd, .events = POLLIN};
        pf[1] = (struct pollfd){.fd = sv->wake[0], .events = POLLIN};
        for (int i = 0; i < n; i++)
            pf[2 + i] = (struct pollfd){.fd = sv->conns[i].fd, .events = sv->conns[i].out_len ? POLLOUT : POLLIN};
        /* wake at least once a second to enforce the deadlines */
        if (poll(pf, (nfds_t)n + 2, 1000) < 0) {
            if (errno == EINTR) continue;
            die_at(__FILE__, __LINE__, "poll", errno_string(), NULL);
        }
        if (pf[1].revents) break;
        double now = time_now();
        for (int i = 0; i < n; i++) {
            Conn *c = &sv->conns[i];
            if (c->fd >= 0 && pf[2 + i].revents) {
                if (c->out_len) {
                    if (pf[2 + i].revents & (POLLERR | POLLHUP)) conn_close(sv, c);
                    else conn_flush(sv, c);
                } else {
                    conn_read(sv, c);
                }
            }
            conn_deadlines(sv, c, now);
        }
        forget_closed(sv); /* their slots only: waiting GETs died with them */
        if (pf[0].revents & POLLIN) conn_accept(sv);
    }
    free(pf);
    return NULL;
}

static double clamp(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

static Server *server_new(const uint8_t *secret, size_t len, double timeout_s) {
    Server *sv = xcalloc(1, sizeof *sv);
    sv->auth_timeout = clamp(timeout_s, 2, AUTH_TIMEOUT_S);
    sv->stall = clamp(timeout_s, 5, STALL_S);
    ASSERT(len <= sizeof sv->secret);
    memcpy(sv->secret, secret, len);
    sv->secret_len = len;
    sv->fd = sv->wake[0] = sv->wake[1] = -1;
    xmutex_init(&sv->mu);
    return sv;
}

static void server_free(Server *sv) {
    for (int i = 0; i < sv->n_conns; i++) conn_close(sv, &sv->conns[i]);
    for (int i = 0; i < sv->n_kv; i++) free(sv->kv[i].key), free(sv->kv[i].val);
    if (sv->fd >= 0) close(sv->fd), close(sv->wake[0]), close(sv->wake[1]);
    pthread_mutex_destroy(&sv->mu);
    free(sv->kv), free(sv->conns), free(sv);
}

static Server *server_start(const char *addr, int port, const uint8_t *secret, size_t len, double timeout_s) {
    /* --standalone: the launcher picked the port by listening on it, and hands that socket to rank 0
     * (STAGE_STORE_FD) — so no other process can take the port between the pick and this store. */
    int fd = net_take_listener("STAGE_STORE_FD", port);
    if (fd < 0) fd = net_listen(addr, port, NULL);
    if (fd < 0) {
        if (errno == EADDRINUSE) {
            const char *why;
            int own = store_dial(addr, port, secret, len, 2, &why);
            if (own >= 0) { /* a store that knows this job's secret: another process is rank 0 already */
                close(own);
                die_user("rank 0 cannot host the rendezvous store on %s:%d: a store that answers to this job's "
                         "secret is there — another process of this job is rank 0 already (two workers given "
                         "RANK=0, or a node given the other's --node-rank); check the ranks the launcher gives",
                         addr, port);
            }
            die_user("rank 0 cannot host the rendezvous store on %s:%d: the port is in use (another "
                     "job, or one still shutting down) — %s", addr, port, store_port_fix);
        }
        if (errno == ENOENT)
            die_user("rank 0 cannot listen on %s:%d: no such host name (it does not resolve) — check "
                     "%s: a host name or address of the node that runs rank 0 (node 0)", addr, port, store_addr_name);
        if (errno == EADDRNOTAVAIL)
            die_user("rank 0 cannot listen on %s:%d: that is not an address of this machine — "
                     "%s must be an address of the node that runs rank 0 (node 0)", addr, port, store_addr_name);
        die_user("rank 0 cannot listen on %s:%d: %s — check %s", addr, port, errno_string(), store_endpoint);
    }
    Server *sv = server_new(secret, len, timeout_s);
    sv->fd = fd;
    CHECK_SYS(pipe2(sv->wake, O_CLOEXEC));
    xthread_create(&sv->thread, server_main, sv);
    return sv;
}

static void server_stop(Server *sv) {
    char b = 1;
    if (write(sv->wake[1], &b, 1) != 1) die_at(__FILE__, __LINE__, "write", errno_string(), NULL);
    pthread_join(sv->thread, NULL);
    server_free(sv);
}

/* The server's request handling without sockets or threads, for the fuzzer (tests/fuzz/): the
 * first byte picks a handshake-done connection or a stranger, the rest arrives in chunks whose
 * sizes come from the input; replies are taken as sent. */
int store_fuzz_input(const uint8_t *data, size_t n) {
    static const uint8_t secret[] = "fuzzing-secret-0123456789";
    Server *sv = server_new(secret, sizeof secret - 1, 10);
    sv->cap_conns = 2;
    sv->conns = xcalloc(2, sizeof *sv->conns);
    sv->n_conns = 2;
    sv->conns[1] = (Conn){.fd = FUZZ_FD, .authed = 1}; /* a rank that waits on GETs */
    sv->n_open = 1;
    Conn *c = &sv->conns[0];
    *c = (Conn){.fd = FUZZ_FD, .authed = n > 0 && (data[0] & 1)};
    sv->n_open += c->authed;
    if (n) data++, n--;
    while (n > 0 && c->fd != -1) {
        size_t chunk = 1 + data[0] % 64;
        data++, n--;
        if (chunk > n) chunk = n;
        conn_input(sv, c, data, chunk);
        data += chunk, n -= chunk;
        if (c->fd != -1 && c->waiting) { /* someone else sets the key the GET waits for */
            char key[STORE_MAX_KEY + 1];
            snprintf(key, sizeof key, "%s", c->waiting);
            wake_waiters(sv, kv_put(sv, key, (const uint8_t *)"v", 1));
        }
    }
    int served = sv->n_kv;
    server_free(sv);
    return served;
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
    uint8_t secret[AUTH_MAX_SECRET]; /* the job's, for the host ring's handshake (store_secret) */
    size_t secret_len;
};

char store_port_fix[320] = "pick a free one with --master-port";
char store_addr_name[96] = "--master-addr";
char store_endpoint[256] = "--master-addr and --master-port";
char store_join_check[256] = "--master-addr (and --master-port, --nnodes, --node-rank)";
char store_world_fix[200] = "start every node with the same --nnodes and --nproc-per-node";
char store_rank_fix[200] = "check --node-rank and --nproc-per-node on every node";

_Noreturn static void lost(const Store *s, const char *what) {
    die_collateral(1, 1, "rank %d: the rendezvous store at %s:%d stopped answering during %s (%s) — rank 0, "
                   "which hosts it, has probably exited: see its error", s->rank, s->addr, s->port, what,
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
            die_collateral(1, 1, "rank %d: waited %.0f s for '%s' in the rendezvous store — the rank that should "
                           "publish it (usually rank 0) is slow, hung or failed: see its error; or it runs another "
                           "build of this program, which never publishes that key (every rank needs the same one)",
                           s->rank, timeout, key);
        lost(s, key);
    }
    uint32_t len = get_u32(r + 4);
    if (op == OP_ADD && r[0] == STATUS_OVERFLOW)
        die_runtime("rank %d: adding to the store's counter '%s' would overflow a 64-bit integer", s->rank, key);
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

/* Rendezvous only: a rank that finds the job misconfigured (a world size that differs from rank 0's,
 * a rank claimed twice) leaves its reason under this key before it exits, so the ranks waiting for it
 * stop at once with the real cause instead of timing out on a rank that will never come. */
#define ABORT_KEY "rdzv/abort"

_Noreturn static void abort_rendezvous(Store *s, const char *fmt, ...) {
    char reason[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    store_set(s, ABORT_KEY, reason, strlen(reason));
    die_user("%s", reason);
}

/* Poll a counter until it reaches target (1 ms, doubling up to 32 ms between looks): 1, or 0 on timeout.
 * Rendezvous and barriers are rare, so polling is simpler than server-side waiting and cannot leave a
 * request hanging on the connection when we give up. With `why` (the rendezvous), a reason left under
 * ABORT_KEY ends the wait too: -1, the reason in why[cap]. */
static int wait_count(Store *s, const char *key, int64_t target, double timeout, char *why, size_t cap) {
    double t_end = time_now() + timeout;
    int pause_us = 1000;
    for (;;) {
        if (store_add(s, key, 0) >= target) return 1;
        if (why && store_check(s, ABORT_KEY)) {
            size_t len = store_get(s, ABORT_KEY, why, cap - 1);
            why[len < cap ? len : cap - 1] = 0;
            return -1;
        }
        if (time_now() > t_end) return 0;
        usleep((useconds_t)pause_us);
        if (pause_us < 20000) pause_us *= 2;
    }
}

/* ", and ADDR is a loopback address here …" when every address addr resolves to on this machine is
 * loopback (127.0.0.0/8, ::1): a job whose ranks run on other machines cannot meet there — "localhost"
 * given by mistake, or a host name that Debian's /etc/hosts maps to 127.0.1.1 on node 0. A job of one
 * machine (as the tests run two "nodes") is fine there, so this only adds to a timeout's message. */
static void loopback_hint(const char *addr, char *out, size_t cap) {
    out[0] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(addr, NULL, &hints, &res) != 0 || !res) return;
    int all = 1;
    char first[INET6_ADDRSTRLEN] = "";
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int lo = 0;
        if (a->ai_family == AF_INET) {
            const struct in_addr *in = &((const struct sockaddr_in *)a->ai_addr)->sin_addr;
            lo = (ntohl(in->s_addr) >> 24) == 127;
            if (!first[0]) inet_ntop(AF_INET, in, first, sizeof first);
        } else if (a->ai_family == AF_INET6) {
            const struct in6_addr *in6 = &((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
            lo = IN6_IS_ADDR_LOOPBACK(in6) || (IN6_IS_ADDR_V4MAPPED(in6) && in6->s6_addr[12] == 127);
            if (!first[0]) inet_ntop(AF_INET6, in6, first, sizeof first);
        }
        all &= lo;
    }
    freeaddrinfo(res);
    char as[INET6_ADDRSTRLEN + 4] = ""; /* a name's address; an address given as such is not repeated */
    if (strcmp(addr, first)) snprintf(as, sizeof as, " (%s)", first);
    if (all)
        snprintf(out, cap, "; and %s is a loopback address here%s, which reaches this machine only: for ranks on "
                 "several machines give node 0's network address (hostname -I on it)", addr, as);
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

/* The client's half of the handshake (auth.h). 0, or -1 with *why saying what went wrong; -2 when the
 * other end hung up before its greeting: the port's listener is going away — rank 0 exiting before its
 * store served anyone (under --standalone the launcher's socket took the connection into its backlog). */
static int client_hello(int fd, const uint8_t *secret, size_t len, double timeout, const char **why) {
    uint8_t hello[AUTH_HELLO + AUTH_NONCE], mine[AUTH_NONCE + AUTH_MAC], theirs[AUTH_MAC], want[AUTH_MAC];
    *why = "it did not send the store's greeting (is something else listening on that port?)";
    if (net_recv_all(fd, hello, sizeof hello, timeout) < 0) {
        if (errno != ECONNRESET) return -1;
        *why = "it closed the connection before its greeting — rank 0, which hosts it, has probably exited: see "
               "its error";
        return -2;
    }
    if (memcmp(hello, "RDZ1", AUTH_HELLO)) return -1;
    auth_random(mine, AUTH_NONCE);
    auth_mac(secret, len, "client", hello + AUTH_HELLO, mine, mine + AUTH_NONCE);
    static _Thread_local char refused[512];
    snprintf(refused, sizeof refused, "it refused this rank's secret: the port belongs to another job (rank 0 could "
             "not host this job's store there: %s), or the ranks were given different STAGE_RDZV_SECRETs",
             store_port_fix);
    *why = refused;
    if (net_send_all(fd, mine, sizeof mine, timeout) < 0 || net_recv_all(fd, theirs, sizeof theirs, timeout) < 0)
        return -1;
    auth_mac(secret, len, "server", hello + AUTH_HELLO, mine, want);
    *why = "it does not know this job's secret (another job's store on that port?)";
    return auth_equal(want, theirs) ? 0 : -1;
}

int store_dial(const char *addr, int port, const uint8_t *secret, size_t len, double timeout_s,
               const char **why) {
    int fd = net_connect(addr, port, timeout_s);
    if (fd < 0) {
        *why = "no connection";
        return -1;
    }
    if (client_hello(fd, secret, len, timeout_s, why) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

Store *store_open(const char *addr, int port, int rank, int world, double timeout_s) {
    ASSERT(rank >= 0 && rank < world && world <= STORE_MAX_WORLD);
    uint8_t secret[AUTH_MAX_SECRET];
    size_t secret_len = auth_secret(secret, sizeof secret);
    if (!secret_len)
        die_user("rank %d has no rendezvous secret: every rank of a job started by torchrun, srun, mpirun "
                 "or on several nodes needs the same one — export STAGE_RDZV_SECRET=$(openssl rand -hex 32) "
                 "(or STAGE_RDZV_SECRET_FILE=a file only you can read) before starting them", rank);
    /* Rank 0's store keeps a socket per rank; every rank has its own connection, the host ring's and
     * the files the run opens (CUDA and NCCL open more, and say so themselves when they run out). */
    long need = 16 + (rank == 0 ? world : 0), have; /* measured on the CPU backend: 11 + world and 8 */
    if (net_reserve_fds(need, &have) < 0)
        die_user("rank %d may open only %ld files (ulimit -n, hard limit), and needs about %ld%s — raise the "
                 "limit (ulimit -n %ld or more, or LimitNOFILE / nofile in your scheduler) and start again", rank,
                 have, need, rank == 0 ? ": it hosts the rendezvous store, a connection per rank" : "",
                 need < 1024 ? 1024 : need);
    /* The errors below exit with the store half-open: keep it reachable until then, so that leak
     * checkers do not report it as lost (the compiler may drop `s` before a _Noreturn call). */
    static _Thread_local Store *volatile opening;
    Store *s = opening = xcalloc(1, sizeof *s);
    s->rank = rank, s->world = world, s->timeout = timeout_s, s->port = port;
    memcpy(s->secret, secret, secret_len);
    s->secret_len = secret_len;
    snprintf(s->addr, sizeof s->addr, "%s", addr);
    xmutex_init(&s->mu);
    if (rank == 0) s->server = server_start(addr, port, secret, secret_len, timeout_s);
    s->fd = net_connect(addr, port, timeout_s);
    if (s->fd < 0 && errno == ENOENT)
        die_user("rank %d could not reach the rendezvous store at %s:%d: no such host name (it did not resolve "
                 "within %.0f s) — check %s: a host name or address of the node that runs rank 0 (node 0)",
                 rank, addr, port, timeout_s, store_addr_name);
    if (s->fd < 0) {
        int e = errno;
        char hint[320];
        loopback_hint(addr, hint, sizeof hint);
        errno = e;
        die_user("rank %d could not reach the rendezvous store at %s:%d within %.0f s (%s) — check "
                 "%s, and that rank 0 (node 0) has started%s",
                 rank, addr, port, timeout_s, errno_string(), store_endpoint, hint);
    }
    const char *why;
    int hello = client_hello(s->fd, secret, secret_len, timeout_s, &why);
    if (hello < 0) /* a hang-up is rank 0's failure, not this rank's (as lost() says of a store lost later) */
        die_collateral(hello == -2, hello == -2 ? 1 : 2, "rank %d: the rendezvous store at %s:%d did not accept "
                       "the handshake: %s", rank, addr, port, why);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(s->fd, (struct sockaddr *)&ss, &len) != 0) /* the address peers reach this rank at */
        die_at(__FILE__, __LINE__, "getsockname(rendezvous store connection)", errno_string(), NULL);
    if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, s->local_ip, sizeof s->local_ip);
    else
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, s->local_ip, sizeof s->local_ip);

    /* Claim the rank: exactly one process may hold each. */
    char key[64];
    snprintf(key, sizeof key, "rdzv/claim/%d", rank);
    if (store_add(s, key, 1) != 1)
        abort_rendezvous(s, "two processes claim rank %d of %d — %s (or another job started with this secret "
                         "holds this port)", rank, world, store_rank_fix);
    /* Everyone must agree on the world size: rank 0 publishes its own. */
    int64_t w = world;
    if (rank == 0) store_set(s, "rdzv/world", &w, sizeof w);
    else {
        store_get(s, "rdzv/world", &w, sizeof w);
        if (w != world)
            abort_rendezvous(s, "rank %d was started with a world size of %d but rank 0 with %lld — %s", rank, world,
                             (long long)w, store_world_fix);
    }
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    snprintf(key, sizeof key, "rdzv/host/%d", rank);
    store_set(s, key, host, strlen(host));
    store_add(s, "rdzv/joined", 1);
    char reason[256];
    int joined = wait_count(s, "rdzv/joined", world, timeout_s, reason, sizeof reason);
    if (joined < 0) die_collateral(1, 2, "rank %d: the rendezvous stopped: %s", rank, reason); /* another's reason */
    if (!joined) {
        char who[600];
        int n = missing_ranks(s, "rdzv/host/%d", who, sizeof who);
        char hint[320];
        loopback_hint(addr, hint, sizeof hint);
        die_collateral(1, 2, "%s did not join within %.0f s — check %s on %s%s", who, timeout_s, store_join_check,
                       n == 1 ? "its node" : "their nodes", hint);
    }
    opening = NULL;
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
    if (!wait_count(s, key, s->world, s->timeout, NULL, 0)) {
        char fmt[64], who[600];
        snprintf(fmt, sizeof fmt, "barrier/%lld/%%d", n);
        missing_ranks(s, fmt, who, sizeof who);
        die_collateral(1, 1, "rank %d: %s did not reach the barrier (%s) within %.0f s — slow, hung or failed: "
                       "see their errors", s->rank, who, what, s->timeout);
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
const uint8_t *store_secret(const Store *s, size_t *len) {
    *len = s->secret_len;
    return s->secret;
}
int store_sequence(Store *s) { return s->sequence++; }
int store_rank(const Store *s) { return s->rank; }
int store_world(const Store *s) { return s->world; }
