/* test_store.c — the rendezvous store against strangers and bad clients (issue 13): a process without
 * the job's secret is refused while the job trains on, a wrong secret or a lax secret file is refused,
 * and a client that does not read, pipelines requests or idles cannot stall, grow or hold the store.
 * The host ring's ports likewise: a stranger can neither take a neighbour's place nor hold it up. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <pthread.h>
#include <errno.h>
#include <netdb.h>
#include <stdatomic.h>
#include <unistd.h>

#include "auth.h"
#include "clock.h"
#include "comm.h"
#include "device.h"
#include "net.h"
#include "store.h"

#include "tests.h"

#define LIMIT "timeout -k 5 120 "
#define TINY "--device cpu --model tiny --test-size 64 --batch-size 16 --progress off"

/* A raw request header (store.h's protocol). */
static void put_req(uint8_t *h, int op, uint32_t klen, uint32_t vlen) {
    memset(h, 0, 12);
    h[0] = (uint8_t)op;
    uint32_t k = htonl(klen), v = htonl(vlen);
    memcpy(h + 4, &k, 4), memcpy(h + 8, &v, 4);
}

/* 1 when the other end closes fd (within wait s of silence), whatever it sends first. */
static int closed_within(int fd, double wait) {
    uint8_t b[64];
    for (;;) {
        int r = net_recv_all(fd, b, 1, wait);
        if (r < 0) return errno != ETIMEDOUT;
    }
}

/* 1 when the server closes fd (within 5 s) instead of answering. */
static int closed_by_server(int fd) { return closed_within(fd, 5); }

/* A CPU job started by our launcher (its own random secret) trains while strangers knock: one sends
 * a forged handshake, one skips it and tries to claim rank 1, one knows a wrong secret. */
START_TEST(stranger_is_refused_while_the_job_trains) {
    char cmd[1024];
    int port = test_free_port();
    snprintf(cmd, sizeof cmd, "env -u STAGE_RDZV_SECRET " LIMIT "%s/stage3 " TINY " --train-size 128 --epochs 6 --nproc-per-node 2 "
             "--master-port %d 2>&1", test_root(), port);
    FILE *job = popen(cmd, "r");
    ck_assert_ptr_nonnull(job);
    /* 1: the greeting, then a handshake made up without the secret */
    int fd = net_connect("127.0.0.1", port, 20);
    ck_assert_int_ge(fd, 0);
    uint8_t hello[36], forged[64] = {0};
    ck_assert_int_eq(net_recv_all(fd, hello, sizeof hello, 5), 0);
    ck_assert(!memcmp(hello, "RDZ1", 4));
    ck_assert_int_eq(net_send_all(fd, forged, sizeof forged, 5), 0);
    ck_assert_msg(closed_by_server(fd), "the store answered a forged handshake");
    close(fd);
    /* 2: no handshake at all, straight to ADD rdzv/claim/1 — never answered */
    fd = net_connect("127.0.0.1", port, 5);
    ck_assert_int_ge(fd, 0);
    uint8_t req[2][12 + 12 + 8] = {{0}}; /* twice: as many bytes as a handshake */
    for (int i = 0; i < 2; i++) {
        put_req(req[i], 3, 12, 8);
        memcpy(req[i] + 12, "rdzv/claim/1", 12);
        req[i][12 + 12 + 7] = 1;
    }
    ck_assert_int_eq(net_send_all(fd, req, sizeof req, 5), 0);
    ck_assert_msg(closed_by_server(fd), "the store answered a client without a handshake");
    close(fd);
    /* 3: a wrong secret */
    const char *why = "";
    const char *wrong = "not-the-jobs-secret-at-all";
    ck_assert_int_lt(store_dial("127.0.0.1", port, (const uint8_t *)wrong, strlen(wrong), 5, &why), 0);
    ck_assert_msg(strstr(why, "refused"), "%s", why);

    char out[1 << 16];
    size_t n = fread(out, 1, sizeof out - 1, job);
    out[n] = 0;
    int rc = pclose(job);
    const char *tail = n > 3000 ? out + n - 3000 : out; /* Check's messages are bounded */
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "the job failed:\n%s", tail);
    ck_assert_msg(strstr(out, "summary:"), "%s", tail);
    ck_assert_msg(strstr(out, "warning: rendezvous store: closed a connection from 127.0.0.1: it does not know "
                              "the job's rendezvous secret"), "no one-line warning:\n%s", tail);
}
END_TEST

typedef struct Args {
    int port, rank, world;
    const char *secret;
} Args;

static void open_with(void *p) {
    Args *a = p;
    setenv("STAGE_RDZV_SECRET", a->secret, 1);
    Store *s = store_open("127.0.0.1", a->port, a->rank, a->world, 3);
    store_close(s);
}

static void secret_from_file(void *p) {
    setenv("STAGE_RDZV_SECRET_FILE", p, 1);
    unsetenv("STAGE_RDZV_SECRET");
    uint8_t b[AUTH_MAX_SECRET];
    printf("secret of %zu bytes\n", auth_secret(b, sizeof b));
}

/* Writes a secret file: n bytes of 's', then `rest` (a secret of its own, or a line end). The file
 * keeps the mode it had. */
static void write_secret(const char *path, int n, const char *rest) {
    FILE *f = fopen(path, "w");
    ck_assert(f);
    for (int i = 0; i < n; i++) fputc('s', f);
    fputs(rest, f);
    fclose(f);
}

/* Two ranks with different secrets: the one that is wrong is told so; a secret file others can
 * read is refused; one only we can read works. */
START_TEST(wrong_secret_and_lax_secret_file_are_refused) {
    Args r0 = {.port = test_free_port(), .rank = 0, .world = 2, .secret = "the-right-secret-0123"};
    Args r1 = r0;
    r1.rank = 1, r1.secret = "a-wrong-secret-4567890";
    char *out;
    int rc0 = -1;
    /* rank 0 in a child (it waits 3 s for rank 1, then fails), rank 1 here with the wrong secret */
    pid_t pid = fork();
    if (pid == 0) {
        close(1), close(2);
        open_with(&r0);
        _exit(0);
    }
    ck_assert_int_eq(test_run_captured(open_with, &r1, &out), 2);
    ck_assert_msg(strstr(out, "rank 1: the rendezvous store at 127.0.0.1:") && strstr(out, "refused this rank's secret"),
                  "%s", out);
    free(out);
    waitpid(pid, &rc0, 0);

    char dir[] = "/tmp/secret_XXXXXX", path[64];
    ck_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/secret", dir);
    write_secret(path, 0, "a-secret-from-a-file-0123\n");
    for (int i = 0; i < 2; i++) { /* others may read it; the group may (a group-readable file is refused too) */
        chmod(path, i ? 0640 : 0644);
        ck_assert_int_eq(test_run_captured(secret_from_file, path, &out), 2);
        ck_assert_msg(strstr(out, "can be read by others") && strstr(out, "chmod 600"), "mode %o: %s", i ? 0640 : 0644,
                      out);
        free(out);
    }
    chmod(path, 0600);
    ck_assert_int_eq(test_run_captured(secret_from_file, path, &out), 0);
    ck_assert_msg(strstr(out, "secret of 25 bytes"), "%s", out); /* the newline is not part of it */
    free(out);
    /* a file longer than a secret was cut to its first 1024 bytes (the variable was refused) */
    write_secret(path, AUTH_MAX_SECRET + 3, "");
    ck_assert_int_eq(test_run_captured(secret_from_file, path, &out), 2);
    ck_assert_msg(strstr(out, "holds 1027 bytes, more than a secret's 1024"), "%s", out);
    free(out);
    /* several nodes, or another launcher, without a secret: refused before anything listens */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env -u STAGE_RDZV_SECRET " LIMIT "%s/stage3 " TINY " --train-size 64 --nnodes 2 "
             "--node-rank 0 --nproc-per-node 1 --master-port %d", test_root(), test_free_port());
    ck_assert_int_eq(test_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--nnodes 2: every node's launcher needs the same rendezvous secret"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "env -u STAGE_RDZV_SECRET RANK=0 WORLD_SIZE=1 TORCHELASTIC_RUN_ID=x " LIMIT "%s/stage3 "
             TINY " --train-size 64 --master-port %d", test_root(), test_free_port());
    ck_assert_int_eq(test_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "rank 0 has no rendezvous secret") && strstr(out, "STAGE_RDZV_SECRET"), "%s", out);
    free(out);
    ck_assert_int_eq(test_run_captured(secret_from_file, dir, &out), 2); /* a directory */
    ck_assert_msg(strstr(out, "not a regular file"), "%s", out);
    free(out);
    unlink(path), rmdir(dir);
}
END_TEST

static void overflow_add(void *p) {
    setenv("STAGE_RDZV_SECRET", TEST_SECRET, 1);
    Store *s = store_open("127.0.0.1", test_free_port(), 0, 1, 5);
    store_add(s, "counter", INT64_MAX);
    store_add(s, "counter", 1);
    printf("no error\n");
}

/* Bad clients of the store (they passed the handshake, or did not): none of them stalls the others,
 * and store_close does not wait for a stranger. */
START_TEST(store_survives_bad_clients) {
    setenv("STAGE_RDZV_SECRET", TEST_SECRET, 1);
    int port = test_free_port();
    Store *s = store_open("127.0.0.1", port, 0, 1, 2); /* strangers get 2 s for the handshake */
    const uint8_t *key = (const uint8_t *)TEST_SECRET;
    const char *why;
    /* a stranger that connects and says nothing */
    int idle = net_connect("127.0.0.1", port, 5);
    ck_assert_int_ge(idle, 0);
    /* a client that asks for a 1 MiB value eight times at once and reads none: the store answers
     * others meanwhile (its replies never block on a client) */
    char *big = calloc(1, STORE_MAX_VALUE);
    store_set(s, "big", big, STORE_MAX_VALUE);
    free(big);
    int greedy = store_dial("127.0.0.1", port, key, strlen(TEST_SECRET), 5, &why);
    ck_assert_msg(greedy >= 0, "%s", why);
    uint8_t req[8][12 + 3];
    for (int i = 0; i < 8; i++) put_req(req[i], 2, 3, 0), memcpy(req[i] + 12, "big", 3);
    ck_assert_int_eq(net_send_all(greedy, req, sizeof req, 5), 0);
    usleep(100000);
    double t0 = time_now();
    ck_assert(store_check(s, "big"));
    ck_assert_msg(time_now() - t0 < 1 * test_time_scale(), "the store stalled on a client that does not read");
    close(greedy);
    /* a second GET while the first still waits: closed (it used to leak the first) */
    int waiter = store_dial("127.0.0.1", port, key, strlen(TEST_SECRET), 5, &why);
    ck_assert_msg(waiter >= 0, "%s", why);
    uint8_t get[12 + 7];
    put_req(get, 2, 7, 0);
    memcpy(get + 12, "missing", 7);
    ck_assert_int_eq(net_send_all(waiter, get, sizeof get, 5), 0);
    ck_assert_int_eq(net_send_all(waiter, get, sizeof get, 5), 0);
    ck_assert_msg(closed_by_server(waiter), "a second GET on a waiting connection was accepted");
    close(waiter);
    /* a malformed value length for CHECK is refused */
    int bad = store_dial("127.0.0.1", port, key, strlen(TEST_SECRET), 5, &why);
    ck_assert_msg(bad >= 0, "%s", why);
    put_req(req[0], 4, 3, 5);
    ck_assert_int_eq(net_send_all(bad, req[0], 12, 5), 0);
    ck_assert(closed_by_server(bad));
    close(bad);
    /* a stranger that is still connected: closing does not wait for it */
    int idle2 = net_connect("127.0.0.1", port, 5);
    ck_assert_int_ge(idle2, 0);
    t0 = time_now();
    store_close(s);
    ck_assert_msg(time_now() - t0 < 2 * test_time_scale(), "store_close waited %.1f s for a stranger", time_now() - t0);
    close(idle2);
    /* (store_close closes every connection, so whether the first stranger was dropped after the
     * handshake timeout can only be seen while the store runs: store_drops_idle_strangers_and_empty_keys) */
    close(idle);

    /* ADD past INT64_MAX is an error, not a wrapped counter */
    char *out;
    ck_assert_int_eq(test_run_captured(overflow_add, NULL, &out), 1);
    ck_assert_msg(strstr(out, "would overflow") && !strstr(out, "no error"), "%s", out);
    free(out);
}
END_TEST

/* A rank stopped by SIGSTOP (hung, not dead): the others time out at --comm-timeout, and the
 * launcher and rank 0 name the stopped rank, not the healthy rank 0. The launcher's SIGTERM ends the
 * stopped rank: the job exits 1, not 143 (as if a SIGTERM had come from outside), and the stopped
 * rank is not counted among the "other" workers (it used to be: "1 other worker stopped; 1 other
 * worker failed too" in a job of two). */
START_TEST(a_stopped_rank_is_named) {
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "STAGE3_FAIL_AT=1:3:STOP " LIMIT "%s/stage3 " TINY " --train-size 256 --epochs 50 "
             "--nproc-per-node 2 --comm-timeout 3 --master-port %d", test_root(), test_free_port());
    double t0 = time_now();
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 1, "exit %d, expected 1:\n%s", rc, out);
    ck_assert_msg(time_now() - t0 < 60 * test_time_scale(), "took %.0f s", time_now() - t0);
    ck_assert_msg(strstr(out, "job failed: rank 1 (local rank 1") && strstr(out, "stopped by SIGSTOP"),
                  "the stopped rank is not named as the failure:\n%s", out);
    ck_assert_msg(strstr(out, "(first failure); 1 other worker failed too\n") && !strstr(out, "other worker stopped"),
                  "the others miscounted:\n%s", out);
    ck_assert_msg(strstr(out, "rank 1 stopped answering") && !strstr(out, "ranks 1 and 1"), "%s", out);
    free(out);
}
END_TEST

/* The fuzzer's entry point handles its seed corpus (tests/fuzz/store/) without crashing. */
START_TEST(store_fuzz_entry_runs) {
    uint8_t in[64] = {1, 63};
    put_req(in + 2, 1, 3, 2); /* SET abc = "hi" (after a chunk-size byte) */
    memcpy(in + 14, "abchi", 5);
    ck_assert_int_eq(store_fuzz_input(in, 19), 1);
    in[0] = 0; /* a stranger: nothing is stored */
    ck_assert_int_eq(store_fuzz_input(in, 19), 0);
}
END_TEST

/* The handshake's MAC binds everything a replay could change: a MAC computed for one role (for the
 * host ring: one pair of ranks), one pair of nonces or one secret is no good for another (else a
 * recorded exchange could be replayed, or a client's MAC reflected back as the server's). */
START_TEST(handshake_mac_binds_role_nonces_and_secret) {
    const uint8_t *secret = (const uint8_t *)TEST_SECRET, *other = (const uint8_t *)"another-secret-of-this-size!";
    size_t len = strlen(TEST_SECRET);
    uint8_t sn[AUTH_NONCE], cn[AUTH_NONCE], base[AUTH_MAC], again[AUTH_MAC], mac[AUTH_MAC];
    for (int i = 0; i < AUTH_NONCE; i++) sn[i] = (uint8_t)i, cn[i] = (uint8_t)(100 + i);
    auth_mac(secret, len, "client", sn, cn, base);
    auth_mac(secret, len, "client", sn, cn, again);
    ck_assert_msg(auth_equal(base, again), "the same inputs gave two MACs");
    auth_mac(secret, len, "server", sn, cn, mac);
    ck_assert_msg(!auth_equal(base, mac), "the client's and the server's MACs are the same");
    sn[AUTH_NONCE - 1] ^= 1;
    auth_mac(secret, len, "client", sn, cn, mac);
    ck_assert_msg(!auth_equal(base, mac), "the MAC ignores the server's nonce");
    sn[AUTH_NONCE - 1] ^= 1;
    cn[AUTH_NONCE - 1] ^= 1;
    auth_mac(secret, len, "client", sn, cn, mac);
    ck_assert_msg(!auth_equal(base, mac), "the MAC ignores the client's nonce");
    cn[AUTH_NONCE - 1] ^= 1;
    auth_mac(other, len, "client", sn, cn, mac);
    ck_assert_msg(!auth_equal(base, mac), "the MAC ignores the secret");
    /* the host ring's roles (comm_host.c) name the communicator and the two ranks: each is its own */
    const char *ring[] = {"ring0 client 0>1", "ring0 client 1>0", "ring1 client 0>1", "ring0 server 0>1"};
    auth_mac(secret, len, ring[0], sn, cn, base);
    for (int i = 1; i < 4; i++) {
        auth_mac(secret, len, ring[i], sn, cn, mac);
        ck_assert_msg(!auth_equal(base, mac), "'%s' and '%s' give the same MAC", ring[0], ring[i]);
    }
}
END_TEST

/* Something listening on the port that greets like the store but does not know the secret: it
 * answers the client's half of the handshake with a MAC it made up. The client must not take it for
 * the job's store (the handshake is mutual). */
static void *fake_store(void *p) {
    int lfd = *(int *)p, fd = accept(lfd, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t hello[AUTH_HELLO + AUTH_NONCE] = "RDZ1", theirs[AUTH_NONCE + AUTH_MAC], mac[AUTH_MAC] = {0};
    auth_random(hello + AUTH_HELLO, AUTH_NONCE);
    if (net_send_all(fd, hello, sizeof hello, 5) == 0 && net_recv_all(fd, theirs, sizeof theirs, 5) == 0)
        net_send_all(fd, mac, sizeof mac, 5);
    uint8_t b;
    net_recv_all(fd, &b, 1, 5); /* until the client hangs up */
    close(fd);
    return NULL;
}

START_TEST(client_refuses_a_store_that_does_not_know_the_secret) {
    int port, lfd = net_listen("127.0.0.1", 0, &port);
    ck_assert_int_ge(lfd, 0);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, fake_store, &lfd), 0);
    const char *why = "";
    int fd = store_dial("127.0.0.1", port, (const uint8_t *)TEST_SECRET, strlen(TEST_SECRET), 5, &why);
    if (fd >= 0) close(fd);
    pthread_join(th, NULL);
    close(lfd);
    ck_assert_msg(fd < 0, "the client accepted a store whose answer carried a made-up MAC");
    ck_assert_msg(strstr(why, "does not know this job's secret"), "%s", why);
}
END_TEST

/* Strangers are dropped by the store itself, while it runs: one that never finishes the handshake
 * after the handshake timeout (2 s here), one that sends a request with an empty key at once. */
START_TEST(store_drops_idle_strangers_and_empty_keys) {
    setenv("STAGE_RDZV_SECRET", TEST_SECRET, 1);
    int port = test_free_port();
    Store *s = store_open("127.0.0.1", port, 0, 1, 2);
    int idle = net_connect("127.0.0.1", port, 5);
    ck_assert_int_ge(idle, 0);
    ck_assert_msg(closed_by_server(idle), "an idle stranger was kept past the handshake timeout");
    close(idle);
    const char *why;
    int fd = store_dial("127.0.0.1", port, (const uint8_t *)TEST_SECRET, strlen(TEST_SECRET), 5, &why);
    ck_assert_msg(fd >= 0, "%s", why);
    uint8_t req[12];
    put_req(req, 4, 0, 0); /* CHECK of the key "" */
    ck_assert_int_eq(net_send_all(fd, req, sizeof req, 5), 0);
    ck_assert_msg(closed_by_server(fd), "the store answered a request with an empty key");
    close(fd);
    ck_assert(store_check(s, "rdzv/world")); /* and it still serves the job */
    store_close(s);
}
END_TEST

/* A GET waits until its key exists; a key that comes into being through ADD 0 (wait_count's poll
 * creates its counter that way) exists too, so the GET is answered then, not at its timeout. */
START_TEST(get_wakes_when_add_zero_creates_the_key) {
    setenv("STAGE_RDZV_SECRET", TEST_SECRET, 1);
    int port = test_free_port();
    Store *s = store_open("127.0.0.1", port, 0, 1, 10);
    const char *why;
    int fd = store_dial("127.0.0.1", port, (const uint8_t *)TEST_SECRET, strlen(TEST_SECRET), 5, &why);
    ck_assert_msg(fd >= 0, "%s", why);
    uint8_t req[12 + 3], resp[8 + 8];
    put_req(req, 2, 3, 0); /* GET "ctr": not there yet, so the store holds the answer back */
    memcpy(req + 12, "ctr", 3);
    ck_assert_int_eq(net_send_all(fd, req, sizeof req, 5), 0);
    /* no answer for 0.3 s: the store has read the GET and holds it (otherwise the ADD might be first) */
    ck_assert_msg(net_recv_all(fd, resp, 1, 0.3) < 0 && errno == ETIMEDOUT, "a GET of a missing key was answered");
    ck_assert_int_eq(store_add(s, "ctr", 0), 0);
    ck_assert_msg(net_recv_all(fd, resp, sizeof resp, 2) == 0, "the GET was not answered when ADD 0 created its key");
    ck_assert_int_eq(resp[0], 1);
    close(fd);
    store_close(s);
}
END_TEST

/* A GET that times out names the key and both causes: the rank that should publish it is slow, hung
 * or failed — or it runs another build, whose rendezvous never publishes that key (a rank from an
 * older build beside a newer one waits exactly so). */
static void get_never_set(void *arg) {
    (void)arg;
    setenv("STAGE_RDZV_SECRET", TEST_SECRET, 1);
    Store *s = store_open("127.0.0.1", test_free_port(), 0, 1, 10);
    store_set_timeout(s, 1);
    uint8_t b[8];
    store_get(s, "rdzv/never/published", b, sizeof b);
}

START_TEST(a_get_that_times_out_names_the_key_and_the_causes) {
    char *out;
    double t0 = time_now();
    int st = test_run_captured(get_never_set, NULL, &out);
    ck_assert_msg(st == 1 && strstr(out, "rank 0: waited 1 s for 'rdzv/never/published'") &&
                      strstr(out, "slow, hung or failed") && strstr(out, "another build of this program"),
                  "exit %d: %s", st, out);
    ck_assert_msg(time_now() - t0 < 10 * test_time_scale(), "took %.1f s", time_now() - t0);
    free(out);
}
END_TEST

static void secret_from_env(void *p) {
    setenv("STAGE_RDZV_SECRET", p, 1);
    uint8_t b[AUTH_MAX_SECRET];
    printf("secret of %zu bytes\n", auth_secret(b, sizeof b));
}

/* A secret too short to resist guessing is refused, from the environment as from a file; the
 * shortest allowed is taken; two secrets (the variable and a file) are refused. */
START_TEST(short_secret_is_refused) {
    ck_assert_int_eq(AUTH_MIN_SECRET, 16); /* 128 bits, the floor auth.h promises: a typo must not lower it */
    char *out, s[AUTH_MIN_SECRET + 1];
    memset(s, 'k', AUTH_MIN_SECRET - 1);
    s[AUTH_MIN_SECRET - 1] = 0;
    ck_assert_int_eq(test_run_captured(secret_from_env, s, &out), 2);
    ck_assert_msg(strstr(out, "use at least") && strstr(out, "openssl rand"), "%s", out);
    free(out);
    s[AUTH_MIN_SECRET - 1] = 'k', s[AUTH_MIN_SECRET] = 0;
    ck_assert_int_eq(test_run_captured(secret_from_env, s, &out), 0);
    char want[32];
    snprintf(want, sizeof want, "secret of %d bytes", AUTH_MIN_SECRET);
    ck_assert_msg(strstr(out, want), "%s", out);
    free(out);
    /* the secret twice, once in a file: which one the job uses would be a guess, and ranks may differ */
    setenv("STAGE_RDZV_SECRET_FILE", "/nonexistent/secret", 1);
    ck_assert_int_eq(test_run_captured(secret_from_env, s, &out), 2);
    ck_assert_msg(strstr(out, "both STAGE_RDZV_SECRET and STAGE_RDZV_SECRET_FILE are set"), "%s", out);
    free(out);
    unsetenv("STAGE_RDZV_SECRET_FILE");
}
END_TEST

/* The secret's upper edges, where an off-by-one would refuse a good secret or cut it: a variable of
 * exactly AUTH_MAX_SECRET characters is taken whole and one more is refused; a file of that many plus a
 * Windows line end ("\r\n", 2 bytes past the secret) is taken as the secret alone, and so is a short
 * one's: both line-end bytes dropped; one byte more than a secret before the line end is refused, not
 * cut. And the MAC depends on the secret's last byte, and auth_equal on
 * the MAC's last byte. */
START_TEST(secret_and_mac_last_bytes_count) {
    static char s[AUTH_MAX_SECRET + 2];
    char *out, want[64];
    unsetenv("STAGE_RDZV_SECRET_FILE");
    memset(s, 'k', AUTH_MAX_SECRET), s[AUTH_MAX_SECRET] = 0;
    ck_assert_int_eq(test_run_captured(secret_from_env, s, &out), 0);
    snprintf(want, sizeof want, "secret of %d bytes", AUTH_MAX_SECRET);
    ck_assert_msg(strstr(out, want), "a %d-character STAGE_RDZV_SECRET: %s", AUTH_MAX_SECRET, out);
    free(out);
    s[AUTH_MAX_SECRET] = 'k', s[AUTH_MAX_SECRET + 1] = 0;
    ck_assert_int_eq(test_run_captured(secret_from_env, s, &out), 2);
    snprintf(want, sizeof want, "STAGE_RDZV_SECRET is longer than %d characters", AUTH_MAX_SECRET);
    ck_assert_msg(strstr(out, want), "%s", out);
    free(out);

    char dir[] = "/tmp/secret_XXXXXX", path[64];
    ck_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/secret", dir);
    write_secret(path, AUTH_MAX_SECRET, "\r\n");
    chmod(path, 0600);
    ck_assert_int_eq(test_run_captured(secret_from_file, path, &out), 0);
    snprintf(want, sizeof want, "secret of %d bytes", AUTH_MAX_SECRET);
    ck_assert_msg(strstr(out, want), "a %d-byte secret and \"\\r\\n\" in a file: %s", AUTH_MAX_SECRET, out);
    free(out);
    /* one byte more than a secret, then a line end: within cap + 2 bytes, but no line end follows the
     * first 1024 — it was cut to them, and two files of one 1024-byte prefix gave one secret */
    write_secret(path, AUTH_MAX_SECRET + 1, "\n");
    ck_assert_int_eq(test_run_captured(secret_from_file, path, &out), 2);
    snprintf(want, sizeof want, "more than a secret's %d", AUTH_MAX_SECRET);
    ck_assert_msg(strstr(out, want), "a %d-byte secret and \"\\n\" in a file: %s", AUTH_MAX_SECRET + 1, out);
    free(out);
    write_secret(path, 0, "a-secret-from-a-file-0123\r\n");
    ck_assert_int_eq(test_run_captured(secret_from_file, path, &out), 0);
    ck_assert_msg(strstr(out, "secret of 25 bytes"), "a secret and \"\\r\\n\" in a file: %s", out);
    free(out);
    unlink(path), rmdir(dir);

    uint8_t sn[AUTH_NONCE] = {1}, cn[AUTH_NONCE] = {2}, a[AUTH_MAC], b[AUTH_MAC];
    char k1[] = "the-secret-ends-in-a", k2[] = "the-secret-ends-in-b";
    auth_mac((const uint8_t *)k1, strlen(k1), "client", sn, cn, a);
    auth_mac((const uint8_t *)k2, strlen(k2), "client", sn, cn, b);
    ck_assert_msg(!auth_equal(a, b), "secrets that differ in their last byte give the same MAC");
    memcpy(b, a, AUTH_MAC);
    b[AUTH_MAC - 1] ^= 1;
    ck_assert_msg(!auth_equal(a, b), "MACs that differ in their last byte are taken as equal");
}
END_TEST

/* The secret a launcher makes for its own node's job (no STAGE_RDZV_SECRET given): 32 random bytes
 * written as 64 hex digits, all of them — a shorter one would still work, with fewer bits — and
 * another each time. */
START_TEST(a_new_secret_is_64_hex_digits) {
    char a[65], b[65];
    memset(a, 'x', sizeof a), memset(b, 'x', sizeof b);
    auth_new_secret(a);
    auth_new_secret(b);
    ck_assert_msg(a[64] == 0 && strspn(a, "0123456789abcdef") == 64, "not 64 hex digits: %.65s", a);
    ck_assert_msg(b[64] == 0 && strspn(b, "0123456789abcdef") == 64, "not 64 hex digits: %.65s", b);
    ck_assert_msg(strcmp(a, b) != 0, "two new secrets are the same: %s", a);
}
END_TEST

/* ---- the host ring's port ------------------------------------------------------------------- */

/* Three ranks as threads; strangers knock on rank 1's ring port before its left neighbour, rank 0,
 * builds its communicator. */
#define RING_WORLD 3

typedef struct RingJob RingJob;
typedef struct RingRank {
    RingJob *job;
    int rank;
    float x[4];
} RingRank;
struct RingJob {
    int port;
    double timeout; /* the communicators' */
    atomic_int go;  /* rank 0 builds its communicator */
    RingRank ranks[RING_WORLD];
    pthread_t threads[RING_WORLD];
};

static void *ring_rank(void *p) {
    RingRank *me = p;
    Device dev = {0};
    device_init(&dev, DEV_CPU, me->rank, 0);
    Store *s = store_open("127.0.0.1", me->job->port, me->rank, RING_WORLD, 30);
    if (me->rank == 0) { /* rank 0 has agreed on the communicator's kind (comm.c), then is slow to build its ring */
        char kind = COMM_HOST;
        store_set(s, "comm0/kind/0", &kind, 1);
        store_set(s, "comm0/kind/verdict", "", 0); /* no difference */
    }
    while (me->rank == 0 && !atomic_load(&me->job->go)) usleep(1000);
    Comm *c = comm_create(COMM_HOST, s, &dev, me->job->timeout);
    for (int i = 0; i < 4; i++) me->x[i] = (float)(me->rank + 1);
    comm_allreduce_async(c, me->x, 4);
    comm_wait(c);
    comm_destroy(c);
    store_close(s);
    device_destroy(&dev);
    return NULL;
}

static void ring_start(RingJob *job) {
    setenv("STAGE_RDZV_SECRET", TEST_SECRET, 1);
    for (int r = 0; r < RING_WORLD; r++) {
        job->ranks[r] = (RingRank){.job = job, .rank = r};
        pthread_create(&job->threads[r], NULL, ring_rank, &job->ranks[r]);
    }
}

/* Rank 1's ring port as it published it in the store (a stranger on the machine sees it listening). */
static int ring_port(int store_port) {
    const char *why, *key = "comm0/ring/1";
    int fd = store_dial("127.0.0.1", store_port, (const uint8_t *)TEST_SECRET, strlen(TEST_SECRET), 20, &why);
    uint8_t req[12 + 16], resp[8];
    char val[128] = "";
    put_req(req, 2, (uint32_t)strlen(key), 0);
    memcpy(req + 12, key, strlen(key));
    int port = -1;
    if (fd >= 0 && net_send_all(fd, req, 12 + strlen(key), 20) == 0 && net_recv_all(fd, resp, 8, 20) == 0) {
        uint32_t len;
        memcpy(&len, resp + 4, 4);
        len = ntohl(len);
        if (len < sizeof val && net_recv_all(fd, val, len, 5) == 0) sscanf(val, "%*s %d", &port);
    }
    if (fd >= 0) close(fd);
    return port;
}

/* Let rank 0 in, wait for the ranks and print how long that took and what they summed. */
static void ring_finish(RingJob *job) {
    double t0 = time_now();
    atomic_store(&job->go, 1);
    for (int r = 0; r < RING_WORLD; r++) pthread_join(job->threads[r], NULL);
    printf("ring done %.2f s after rank 0 came\n", time_now() - t0);
    int exact = 1;
    for (int r = 0; r < RING_WORLD; r++) {
        const float *x = job->ranks[r].x;
        printf("rank %d: %g %g %g %g\n", r, x[0], x[1], x[2], x[3]);
        for (int i = 0; i < 4; i++) exact &= x[i] == RING_WORLD * (RING_WORLD + 1) / 2;
    }
    printf("%s\n", exact ? "sums exact" : "sums wrong");
}

static void ring_strangers_knock(void *p) {
    RingJob job = {.port = *(int *)p, .timeout = 20 * test_time_scale()};
    ring_start(&job);
    int port = ring_port(job.port);
    /* 1: what the ring took before it had a handshake: the left neighbour's rank id, then numbers to add */
    int id = net_connect("127.0.0.1", port, 5);
    int32_t left = 0;
    float junk[64];
    for (int i = 0; i < 64; i++) junk[i] = 1000;
    net_send_all(id, &left, sizeof left, 5);
    net_send_all(id, junk, sizeof junk, 5);
    /* 2: the ring's handshake, the right ranks and a MAC made with a wrong secret */
    int forged = net_connect("127.0.0.1", port, 5);
    uint8_t hello[AUTH_HELLO + AUTH_NONCE], msg[AUTH_NONCE + 8 + AUTH_MAC];
    if (net_recv_all(forged, hello, sizeof hello, 2) == 0) {
        const char *wrong = "not-the-jobs-secret-at-all";
        uint32_t ranks[2] = {htonl(0), htonl(1)};
        auth_random(msg, AUTH_NONCE);
        memcpy(msg + AUTH_NONCE, ranks, 8);
        auth_mac((const uint8_t *)wrong, strlen(wrong), "ring0 client 0>1", hello + AUTH_HELLO, msg,
                 msg + AUTH_NONCE + 8);
        net_send_all(forged, msg, sizeof msg, 5);
    }
    ring_finish(&job);
    printf("stranger 1 %s, stranger 2 %s\n", closed_within(id, 5) ? "closed" : "kept",
           closed_within(forged, 5) ? "closed" : "kept");
    close(id), close(forged);
}

/* Strangers on a ring port while the job builds its host ring: one sends the rank id the ring used
 * to trust, then numbers to add; one answers the ring's handshake with a MAC made up without the
 * secret. Both are refused with a warning, the real neighbour gets in, and the sum is exact (before
 * the handshake the first one took rank 0's place: rank 1 summed 1000s, rank 0 was refused). */
START_TEST(ring_port_refuses_strangers) {
    int port = test_free_port();
    char *out;
    int rc = test_run_captured(ring_strangers_knock, &port, &out);
    ck_assert_msg(rc == 0 && strstr(out, "sums exact"), "exit %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "stranger 1 closed, stranger 2 closed"), "%s", out);
    ck_assert_msg(strstr(out, "warning: rank 1: host ring: closed a connection from 127.0.0.1: it says it is rank"),
                  "no warning about the rank id:\n%s", out);
    ck_assert_msg(strstr(out, "warning: rank 1: host ring: closed a connection from 127.0.0.1: it does not know the "
                              "job's rendezvous secret"), "no warning about the MAC:\n%s", out);
    free(out);
}
END_TEST

static void ring_idle_strangers(void *p) {
    RingJob job = {.port = *(int *)p, .timeout = 6 * test_time_scale()};
    ring_start(&job);
    int port = ring_port(job.port);
    int idle = net_connect("127.0.0.1", port, 5);
    double t0 = time_now();
    int closed = closed_within(idle, 4 * job.timeout);
    printf("idle stranger 1 %s after %.1f s\n", closed ? "closed" : "kept", time_now() - t0);
    int idle2 = net_connect("127.0.0.1", port, 5); /* still there when rank 0 comes */
    ring_finish(&job);
    printf("idle stranger 2 %s\n", closed_within(idle2, 5) ? "closed" : "kept");
    close(idle), close(idle2);
}

/* Strangers that connect to a ring port and say nothing: one alone is closed after its turn (half
 * the timeout, 3 s here), one that is there when the real neighbour comes does not hold it up (the
 * ring used to wait for the first connection's rank id until the timeout, then fail). */
START_TEST(ring_port_drops_idle_strangers) {
    int port = test_free_port();
    char *out;
    double scale = test_time_scale();
    int rc = test_run_captured(ring_idle_strangers, &port, &out);
    ck_assert_msg(rc == 0 && strstr(out, "sums exact"), "exit %d:\n%s", rc, out);
    double after = -1, done = -1;
    const char *p = strstr(out, "idle stranger 1 closed after ");
    ck_assert_msg(p && sscanf(p, "idle stranger 1 closed after %lf", &after) == 1, "%s", out);
    ck_assert_msg(after > 2.5 * scale && after < 5 * scale, "closed after %.1f s, its turn is %.0f s:\n%s", after,
                  3 * scale, out);
    ck_assert_msg((p = strstr(out, "ring done ")) && sscanf(p, "ring done %lf", &done) == 1, "%s", out);
    ck_assert_msg(done < 2 * scale, "the idle stranger held the ring up for %.1f s:\n%s", done, out);
    ck_assert_msg(strstr(out, "idle stranger 2 closed"), "%s", out);
    char want[128];
    snprintf(want, sizeof want, "closed a connection from 127.0.0.1: no handshake within %.0f s", 3 * scale);
    ck_assert_msg(strstr(out, want), "no warning '%s':\n%s", want, out);
    free(out);
}
END_TEST

/* A --master-addr that names two addresses (localhost as ::1 and 127.0.0.1, as on Debian and Ubuntu):
 * with the first taken by another job's store, rank 0 (and the launcher's check) listened on the
 * second, and every rank — rank 0 too — connected to the first, the other job's store, which refused
 * their secret ("rank 0 could not host this job's store there", where it had). The port counts as in
 * use. Needs a name of two addresses, which a machine's /etc/hosts may not give: then it skips. */
START_TEST(a_port_taken_on_a_names_first_address_is_in_use) {
    const char *name = "localhost";
    int port = test_free_port();
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    if (getaddrinfo(name, ps, &hints, &res) != 0) {
        printf("SKIP: store: %s does not resolve\n", name);
        return;
    }
    if (!res->ai_next || res->ai_next->ai_family == res->ai_family) {
        printf("SKIP: store: the port taken on one address of a host name with two — %s has one here (/etc/hosts)\n",
               name);
        freeaddrinfo(res);
        return;
    }
    int other = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0); /* another job's store, on the first */
    ck_assert(other >= 0);
    ck_assert_msg(bind(other, res->ai_addr, res->ai_addrlen) == 0 && listen(other, 4) == 0, "bind: %s",
                  strerror(errno));
    freeaddrinfo(res);
    errno = 0;
    int fd = net_listen(name, port, NULL);
    int err = errno;
    if (fd >= 0) close(fd);
    close(other);
    ck_assert_msg(fd < 0 && err == EADDRINUSE, "net_listen(%s:%d) with its first address taken: fd %d, %s", name,
                  port, fd, strerror(err));
}
END_TEST

/* --standalone's hand-over (launch.c): the launcher listens on the port it picked and passes that socket
 * to rank 0 in STAGE_STORE_FD, so the port is never free between the pick and the store. Rank 0's store
 * takes the socket — a store that bound the port itself would find it held (by us, here) and stop — and
 * the variable is gone afterwards; a descriptor that is not a listener on that port is left alone. */
START_TEST(the_store_takes_the_launchers_listening_socket) {
    setenv("STAGE_RDZV_SECRET", TEST_SECRET, 1);
    int port, lfd = net_listen("127.0.0.1", 0, &port);
    ck_assert(lfd >= 0);
    char v[16];
    snprintf(v, sizeof v, "%d", lfd);
    setenv("STAGE_STORE_FD", v, 1);
    Store *s = store_open("127.0.0.1", port, 0, 1, 10);
    ck_assert_msg(!getenv("STAGE_STORE_FD"), "STAGE_STORE_FD is still set: a process started later would take it");
    ck_assert_msg(fcntl(lfd, F_GETFD) & FD_CLOEXEC, "the socket taken is not close-on-exec");
    store_set(s, "k", "v", 1);
    const char *why;
    int fd = store_dial("127.0.0.1", port, (const uint8_t *)TEST_SECRET, strlen(TEST_SECRET), 5, &why);
    ck_assert_msg(fd >= 0, "no store answers on the handed-over socket: %s", why);
    close(fd);
    store_close(s); /* closes lfd: it is the store's now */
    /* not taken: the wrong port, a socket that does not listen, no number, no descriptor */
    int other, oport;
    other = net_listen("127.0.0.1", 0, &oport);
    int plain = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char bad[4][16];
    snprintf(bad[0], 16, "%d", other), snprintf(bad[1], 16, "%d", plain), snprintf(bad[2], 16, "3x"),
        snprintf(bad[3], 16, "987654");
    for (int i = 0; i < 4; i++) {
        setenv("STAGE_STORE_FD", bad[i], 1);
        ck_assert_msg(net_take_listener("STAGE_STORE_FD", i == 0 ? oport + 1 : oport) < 0, "took %s", bad[i]);
        ck_assert(!getenv("STAGE_STORE_FD"));
    }
    ck_assert_int_eq(net_take_listener("STAGE_STORE_FD", oport), -1); /* unset */
    close(other), close(plain);
}
END_TEST

Suite *suite_store(void) {
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stranger_is_refused_while_the_job_trains);
    tcase_add_test(tc, wrong_secret_and_lax_secret_file_are_refused);
    tcase_add_test(tc, store_survives_bad_clients);
    tcase_add_test(tc, store_fuzz_entry_runs);
    tcase_add_test(tc, a_stopped_rank_is_named);
    tcase_add_test(tc, handshake_mac_binds_role_nonces_and_secret);
    tcase_add_test(tc, client_refuses_a_store_that_does_not_know_the_secret);
    tcase_add_test(tc, store_drops_idle_strangers_and_empty_keys);
    tcase_add_test(tc, get_wakes_when_add_zero_creates_the_key);
    tcase_add_test(tc, a_get_that_times_out_names_the_key_and_the_causes);
    tcase_add_test(tc, short_secret_is_refused);
    tcase_add_test(tc, secret_and_mac_last_bytes_count);
    tcase_add_test(tc, a_new_secret_is_64_hex_digits);
    tcase_add_test(tc, ring_port_refuses_strangers);
    tcase_add_test(tc, ring_port_drops_idle_strangers);
    tcase_add_test(tc, a_port_taken_on_a_names_first_address_is_in_use);
    tcase_add_test(tc, the_store_takes_the_launchers_listening_socket);
    suite_add_tcase(s, tc);
    return s;
}
