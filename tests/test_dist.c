/* test_dist.c — stage 3's plumbing: the sampler as ./stage3 prints it, the rendezvous store, the
 * host ring all-reduce, and the launcher (bad flags, a failing rank, torchrun / srun conventions).
 * Ranks of in-process tests are threads, each with its own store connection and communicator;
 * everything listens on 127.0.0.1 only, and every child process runs under `timeout`. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "comm.h"
#include "comm_internal.h" /* OPS: how many operations the ring of slots holds */
#include "data.h"            /* cifar10_file_names: a small CIFAR-10 set on disk */
#include "device.h"
#include "errors.h"
#include "launch.h"
#include "rng.h"
#include "sampler.h"
#include "net.h"
#include "precision.h"
#include "stop.h"
#include "store.h"
#include "worker_status.h"

#include "tests.h"

#define LIMIT "timeout -k 5 120 " /* no test leaves a process behind, even when it fails */

static int stage3(const char *env, const char *args, char **out) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s " LIMIT "%s/stage3 %s", env ? env : "", test_root(), args);
    return test_run(cmd, out);
}

/* ---- the sampler, as ./stage3 --show-sampler prints it ---------------------------------------- */

START_TEST(show_sampler_prints_the_shard) {
    struct { int64_t n; int world, rank; int64_t epoch, seed; int drop_last, shuffle; } cases[] = {
        {10, 3, 1, 2, 5, 0, 1},  {10, 3, 2, 0, 0, 1, 1}, {3, 4, 3, 1, 7, 0, 1},  /* N < R: repeats */
        {17, 4, 0, 3, 42, 0, 0}, {1000, 8, 5, 9, 1, 1, 1}, {50000, 2, 1, 4, 0, 0, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char args[512], *out;
        snprintf(args, sizeof args, "--show-sampler --dataset-size %lld --world-size %d --rank %d --epoch %lld --seed %lld%s%s",
                 (long long)cases[c].n, cases[c].world, cases[c].rank, (long long)cases[c].epoch,
                 (long long)cases[c].seed, cases[c].drop_last ? " --drop-last" : "", cases[c].shuffle ? "" : " --no-shuffle");
        ck_assert_msg(stage3(NULL, args, &out) == 0, "%s\n%s", args, out);
        int64_t k = sampler_num_samples(cases[c].n, cases[c].world, cases[c].drop_last);
        int64_t *want = malloc((size_t)(k + 1) * sizeof(int64_t));
        sampler_indices(cases[c].n, cases[c].world, cases[c].rank, (uint64_t)cases[c].seed, cases[c].epoch,
                        cases[c].shuffle, cases[c].drop_last, want);
        char *p = out, *end;
        for (int64_t i = 0; i < k; i++) {
            long long v = strtoll(p, &end, 10);
            ck_assert_msg(end != p, "%s: only %lld of %lld indices printed", args, (long long)i, (long long)k);
            ck_assert_msg(v == want[i], "%s: index %lld is %lld, expected %lld", args, (long long)i, v, (long long)want[i]);
            p = end;
        }
        while (*p == ' ' || *p == '\n') p++;
        ck_assert_msg(*p == 0, "%s: extra output '%.40s'", args, p);
        free(want), free(out);
    }
}
END_TEST

/* ---- the store ------------------------------------------------------------------------------- */

typedef struct RankArg {
    int rank, world, port;
    int64_t count;  /* ring tests: floats to reduce */
    int root;
    int ok;
    char msg[256];
} RankArg;

/* Ranks 0 … world-1 as threads, each running fn on a copy of proto with its rank and the world
 * filled in, all joined; every one must have said ok (else its message). */
enum { MAX_RANK_THREADS = 8 };
static void run_rank_threads(int world, void *(*fn)(void *), RankArg proto) {
    ck_assert(world <= MAX_RANK_THREADS);
    pthread_t t[MAX_RANK_THREADS];
    RankArg a[MAX_RANK_THREADS];
    for (int r = 0; r < world; r++) {
        a[r] = proto, a[r].rank = r, a[r].world = world;
        pthread_create(&t[r], NULL, fn, &a[r]);
    }
    for (int r = 0; r < world; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < world; r++)
        ck_assert_msg(a[r].ok, "rank %d: %s", r, a[r].msg[0] ? a[r].msg : "did not finish");
}

static void *store_rank_main(void *p) {
    RankArg *a = p;
    Store *s = store_open("127.0.0.1", a->port, a->rank, a->world, 20);
    char key[32], val[64];
    snprintf(key, sizeof key, "hello/%d", a->rank);
    snprintf(val, sizeof val, "from rank %d", a->rank);
    store_set(s, key, val, strlen(val) + 1);
    /* get waits for a key another rank sets later */
    if (a->rank == a->world - 1) {
        usleep(100000);
        store_set(s, "late", "finally", 8);
    }
    char got[64] = "";
    store_wait(s, "late");
    ck_assert_uint_eq(store_get(s, "late", got, sizeof got), 8);
    ck_assert_str_eq(got, "finally");
    for (int r = 0; r < a->world; r++) {
        snprintf(key, sizeof key, "hello/%d", r);
        memset(got, 0, sizeof got);
        store_get(s, key, got, sizeof got);
        snprintf(val, sizeof val, "from rank %d", r);
        ck_assert_str_eq(got, val);
    }
    /* add is atomic: every rank adds rank+1 ten times */
    for (int i = 0; i < 10; i++) store_add(s, "counter", a->rank + 1);
    store_barrier(s, "after adding");
    ck_assert_int_eq(store_add(s, "counter", 0), 10 * a->world * (a->world + 1) / 2);
    ck_assert(store_check(s, "late"));
    ck_assert(!store_check(s, "never-set"));
    /* a value at the size limit round-trips */
    if (a->rank == 1) {
        char *big = malloc(STORE_MAX_VALUE);
        for (int i = 0; i < STORE_MAX_VALUE; i++) big[i] = (char)(i * 7);
        store_set(s, "big", big, STORE_MAX_VALUE);
        free(big);
    }
    char *back = malloc(STORE_MAX_VALUE);
    ck_assert_uint_eq(store_get(s, "big", back, STORE_MAX_VALUE), STORE_MAX_VALUE);
    for (int i = 0; i < STORE_MAX_VALUE; i += 4099) ck_assert(back[i] == (char)(i * 7));
    free(back);
    store_barrier(s, "before closing");
    store_close(s);
    a->ok = 1;
    return NULL;
}

START_TEST(store_set_get_add_barrier) {
    run_rank_threads(4, store_rank_main, (RankArg){.port = test_free_port()});
}
END_TEST

/* A request larger than the limit closes that connection; the server keeps serving the others. */
static void *oversized_rank0(void *p) {
    RankArg *a = p;
    Store *s = store_open("127.0.0.1", a->port, 0, 1, 10);
    /* a key of exactly the limit is a valid request: served, not refused */
    char longest[STORE_MAX_KEY + 1], back[8] = "";
    memset(longest, 'k', STORE_MAX_KEY);
    longest[STORE_MAX_KEY] = 0;
    store_set(s, longest, "max", 4);
    store_get(s, longest, back, sizeof back);
    ck_assert_str_eq(back, "max");
    const char *why;
    int fd = store_dial("127.0.0.1", a->port, (const uint8_t *)TEST_SECRET, strlen(TEST_SECRET), 5, &why);
    ck_assert_msg(fd >= 0, "%s", why);
    unsigned char h[12] = {1, 0, 0, 0, 0, 0, 0, 3};
    uint32_t v = htonl(STORE_MAX_VALUE + 1);
    memcpy(h + 8, &v, 4);
    ck_assert(net_send_all(fd, h, sizeof h, 5) == 0);
    char c;
    ck_assert_msg(net_recv_all(fd, &c, 1, 5) < 0, "the store answered an oversized request");
    close(fd);
    store_set(s, "still", "alive", 6);
    char got[8] = "";
    store_get(s, "still", got, sizeof got);
    ck_assert_str_eq(got, "alive");
    store_close(s);
    a->ok = 1;
    return NULL;
}

START_TEST(store_bounds_message_sizes) {
    RankArg a = {.port = test_free_port()};
    pthread_t t;
    pthread_create(&t, NULL, oversized_rank0, &a);
    pthread_join(t, NULL);
    ck_assert(a.ok);
}
END_TEST

typedef struct OpenArg {
    int port, rank, world;
    double timeout;
    const char *addr; /* NULL: 127.0.0.1 */
} OpenArg;
static void open_store(void *p) {
    OpenArg *o = p;
    store_open(o->addr ? o->addr : "127.0.0.1", o->port, o->rank, o->world, o->timeout);
}

START_TEST(store_rendezvous_timeouts_are_clear) {
    char *out;
    /* rank 0 alone in a world of 2: names the rank that did not come */
    OpenArg a = {.port = test_free_port(), .rank = 0, .world = 2, .timeout = 1};
    double t0 = time_now();
    ck_assert_int_eq(test_run_captured(open_store, &a, &out), 2);
    ck_assert_msg(strstr(out, "rank 1 did not join within 1 s") && strstr(out, "--master-addr"), "%s", out);
    ck_assert(time_now() - t0 < 5 * test_time_scale());
    free(out);
    /* rank 0 alone in a world of 11: the first eight missing ranks named, then how many more */
    OpenArg many = {.port = test_free_port(), .rank = 0, .world = 11, .timeout = 1};
    ck_assert_int_eq(test_run_captured(open_store, &many, &out), 2);
    ck_assert_msg(strstr(out, "ranks 1, 2, 3, 4, 5, 6, 7, 8 and 2 more did not join within 1 s"), "%s", out);
    free(out);
    /* rank 1 with nobody hosting the store */
    OpenArg b = {.port = test_free_port(), .rank = 1, .world = 2, .timeout = 1};
    ck_assert_int_eq(test_run_captured(open_store, &b, &out), 2);
    ck_assert_msg(strstr(out, "rank 1 could not reach the rendezvous store at 127.0.0.1:") && strstr(out, "--master-addr"),
                  "%s", out);
    free(out);
}
END_TEST

/* A store on a loopback address serves this machine alone: "localhost" given by mistake for a job of
 * several machines, or node 0's host name that Debian's /etc/hosts maps to 127.0.1.1 there. Both sides
 * timed out telling the other nodes to check --master-addr; the timeouts now say the address is
 * loopback here, and what to give instead. */
START_TEST(a_loopback_master_addr_is_named_on_timeout) {
    static const struct { const char *addr; int rank; const char *says; } cases[] = {
        {"127.0.0.1", 0, "rank 1 did not join within 1 s"},
        {"localhost", 0, "localhost is a loopback address here (127."},
        {"localhost", 1, "rank 1 could not reach the rendezvous store at localhost:"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        OpenArg a = {.port = test_free_port(), .rank = cases[i].rank, .world = 2, .timeout = 1, .addr = cases[i].addr};
        ck_assert_int_eq(test_run_captured(open_store, &a, &out), 2);
        ck_assert_msg(strstr(out, cases[i].says) && strstr(out, " is a loopback address here") &&
                          strstr(out, "give node 0's network address"), "%s rank %d:\n%s", cases[i].addr, cases[i].rank,
                      out);
        free(out);
    }
}
END_TEST

/* rank 0 given a --master-addr it cannot host on: a name that does not resolve, and an address of
 * another machine (TEST-NET-1), each with its own advice; another rank given a name that does not
 * resolve */
START_TEST(store_bad_master_addr_is_clear) {
    char *out;
    OpenArg a = {.port = test_free_port(), .rank = 0, .world = 1, .timeout = 2, .addr = "nosuchhost.invalid"};
    ck_assert_int_eq(test_run_captured(open_store, &a, &out), 2);
    ck_assert_msg(strstr(out, "no such host name") && strstr(out, "--master-addr"), "%s", out);
    free(out);
    OpenArg b = {.port = test_free_port(), .rank = 0, .world = 1, .timeout = 2, .addr = "192.0.2.1"};
    ck_assert_int_eq(test_run_captured(open_store, &b, &out), 2);
    ck_assert_msg(strstr(out, "not an address of this machine") && strstr(out, "--master-addr"), "%s", out);
    free(out);
    /* another rank, which only connects: the name was reported as "(No route to host)" */
    OpenArg c = {.port = test_free_port(), .rank = 1, .world = 2, .timeout = 2, .addr = "nosuchhost.invalid"};
    ck_assert_int_eq(test_run_captured(open_store, &c, &out), 2);
    ck_assert_msg(strstr(out, "rank 1") && strstr(out, "no such host name") && strstr(out, "--master-addr") &&
                  !strstr(out, "route"), "%s", out);
    free(out);
    /* a host written with its port (torchrun's --rdzv-endpoint form), in brackets, or as a URL: told how to write
     * it, at once, not "does not resolve" (on a node other than node 0: after --rdzv-timeout) */
    const struct { const char *addr, *expect; } forms[] = {
        {"127.0.0.1:29511", "--master-addr 127.0.0.1 --master-port 29511"},
        {"[::1]", "without brackets (--master-addr ::1)"},
        {"tcp://127.0.0.1:29511", "is a URL"},
    };
    for (int i = 0; i < 3; i++) {
        char args[512];
        snprintf(args, sizeof args, "--device cpu --model tiny --nproc-per-node 1 --master-addr %s", forms[i].addr);
        ck_assert_int_eq(stage3(NULL, args, &out), 2);
        ck_assert_msg(strstr(out, forms[i].expect) && !strstr(out, "does not resolve"), "%s:\n%s", forms[i].addr, out);
        free(out);
    }
}
END_TEST

/* Too few file descriptors used to fail far from the cause — a store that could not accept its ranks
 * read as a network problem ("did not join within 60 s — check --master-addr"), or hung: a low soft
 * limit is now raised (to the hard one, as servers do), and a hard limit below what a job needs is
 * refused at once, naming ulimit -n. */
START_TEST(too_few_file_descriptors_is_clear) {
    char *out, args[256];
    snprintf(args, sizeof args, "--device cpu --model tiny --train-size 64 --test-size 32 --batch-size 16 --epochs 1 "
             "--progress off --nproc-per-node 2 --master-port %d --rdzv-timeout 20", test_free_port());
    double t0 = time_now();
    ck_assert_int_eq(stage3("ulimit -n 12;", args, &out), 2);
    ck_assert_msg(strstr(out, "may open only 12 files (ulimit -n, hard limit)") && strstr(out, "raise the limit") &&
                  strstr(out, "job failed") && !strstr(out, "--master-addr"), "%s", out);
    ck_assert(time_now() - t0 < 15 * test_time_scale());
    free(out);
    snprintf(args, sizeof args, "--device cpu --model tiny --train-size 64 --test-size 32 --batch-size 16 --epochs 1 "
             "--progress off --nproc-per-node 2 --master-port %d --rdzv-timeout 20", test_free_port());
    ck_assert_msg(stage3("ulimit -Sn 12;", args, &out) == 0, "a low soft limit should be raised:\n%s", out);
    free(out);
}
END_TEST

/* net_reserve_fds at its edge: a hard limit of exactly what is needed is enough, one less is not
 * (and says how many there are). In a child: the limit it sets is its own. */
static void reserve_at_the_limit(void *arg) {
    struct rlimit rl = {.rlim_cur = 64, .rlim_max = 64};
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) exit(9);
    long have = 0, have2 = 0;
    int enough = net_reserve_fds(64, &have), short_by_one = net_reserve_fds(65, &have2);
    exit(enough == 0 && have == 64 && short_by_one == -1 && have2 == 64 ? 0 : 1);
}

/* A peer that closes its end: reading from it, or writing to it, fails with ECONNRESET (the messages
 * say "connection reset"), not a misleading EAGAIN or EPIPE. And a listener queues many connections. */
START_TEST(net_edges_file_limit_and_closed_peer) {
    char *out;
    ck_assert_msg(test_run_captured(reserve_at_the_limit, NULL, &out) == 0, "net_reserve_fds at the limit: %s", out);
    free(out);
    int sv[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ck_assert_int_eq(net_send_all(sv[1], "ab", 2, 1.0), 0);
    close(sv[1]);
    char buf[4];
    errno = 0;
    ck_assert_int_eq(net_recv_all(sv[0], buf, 4, 1.0), -1); /* two bytes, then the end */
    ck_assert_msg(errno == ECONNRESET, "recv from a closed peer: %s", strerror(errno));
    errno = 0;
    ck_assert_int_eq(net_send_all(sv[0], "x", 1, 1.0), -1);
    ck_assert_msg(errno == ECONNRESET, "send to a closed peer: %s", strerror(errno));
    close(sv[0]);
    /* a listener's backlog holds a crowd of ranks that connect at once, before it accepts any (a
     * rendezvous of many ranks): 32 connections complete without an accept */
    int port = 0, lfd = net_listen("127.0.0.1", 0, &port), fds[32];
    ck_assert_int_ge(lfd, 0);
    for (int i = 0; i < 32; i++) {
        fds[i] = net_connect("127.0.0.1", port, 2.0);
        ck_assert_msg(fds[i] >= 0, "connection %d of 32 to a listener that has accepted none: %s", i + 1,
                      strerror(errno));
    }
    for (int i = 0; i < 32; i++) close(fds[i]);
    close(lfd);
}
END_TEST

/* A rank that reaches the store's port while rank 0 is exiting (its store not yet serving: under
 * --standalone the launcher's socket takes the connection into its backlog, then rank 0 fails — a
 * --save directory another run holds, say — and the socket closes unanswered) blames rank 0, as a
 * store lost later does, and marks itself collateral; it said "is something else listening on that
 * port?", which sent the user hunting for another program. A port that answers nothing stays that. */
/* The acceptor is a process, not a thread: the rank runs in a fork of this test, and a fork taken
 * while another thread was starting inherited the sanitizer's locks held — under AddressSanitizer
 * the rank then hung in its exit until Check's timeout (once in CI, 2026-12-06). */
static void accept_then(int lfd, int hang_up) {
    int c = accept(lfd, NULL, NULL);
    if (c >= 0 && hang_up) close(c); /* hang up at once */
    if (c >= 0 && !hang_up) usleep(3000000), close(c); /* hold it, silent, past the rank's timeout */
}

START_TEST(store_closed_before_its_greeting_names_rank_0) {
    for (int hang_up = 1; hang_up >= 0; hang_up--) {
        int port = test_free_port(), lfd = net_listen("127.0.0.1", port, NULL);
        ck_assert(lfd >= 0);
        fflush(stdout), fflush(stderr);
        pid_t acceptor = fork();
        ck_assert_int_ge(acceptor, 0);
        if (acceptor == 0) {
            accept_then(lfd, hang_up);
            _exit(0);
        }
        OpenArg a = {.port = port, .rank = 1, .world = 2, .timeout = 1};
        char *out;
        int rc = test_run_captured(open_store, &a, &out);
        if (hang_up)
            ck_assert_msg(rc == 1 && strstr(out, "closed the connection before its greeting") &&
                          strstr(out, "rank 0, which hosts it, has probably exited") &&
                          !strstr(out, "something else listening"), "exit %d: %s", rc, out);
        else
            ck_assert_msg(rc == 2 && strstr(out, "something else listening on that port"), "exit %d: %s", rc, out);
        free(out);
        int st;
        ck_assert_int_eq(waitpid(acceptor, &st, 0), acceptor);
        close(lfd);
    }
}
END_TEST

START_TEST(store_port_in_use_is_clear) {
    int port = test_free_port();
    int fd = net_listen("127.0.0.1", port, NULL);
    ck_assert(fd >= 0);
    OpenArg a = {.port = port, .rank = 0, .world = 1, .timeout = 2};
    char *out;
    ck_assert_int_eq(test_run_captured(open_store, &a, &out), 2);
    ck_assert_msg(strstr(out, "in use") && strstr(out, "--master-port"), "%s", out);
    free(out);
    /* the same through ./stage3: the launcher finds the port taken before it starts any worker (else
     * rank 1 could reach the other job's store and blame its secret) */
    char args[256], want[64];
    snprintf(args, sizeof args, "--device cpu --model tiny --train-size 256 --master-port %d --rdzv-timeout 20", port);
    snprintf(want, sizeof want, "--master-port %d on 127.0.0.1 is in use", port);
    double t0 = time_now();
    ck_assert_int_eq(stage3(NULL, args, &out), 2);
    ck_assert_msg(strstr(out, want) && !strstr(out, "launching"), "%s", out);
    ck_assert(time_now() - t0 < 10 * test_time_scale());
    free(out);
    /* a worker's port comes from its launcher's MASTER_PORT, which --master-port cannot override: the
     * advice names what to change (it used to say --master-port, which was then refused), and under
     * torchrun's agent store why the port is one past torchrun's */
    char env[256];
    static const struct { const char *env; int minus; const char *says; } from_env[] = {
        {"SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2", 0,
         "the port is MASTER_PORT=%d from the environment, which --master-port cannot override: export a free"},
        {"RANK=0 WORLD_SIZE=2 TORCHELASTIC_RUN_ID=x TORCHELASTIC_USE_AGENT_STORE=True", 1,
         "torchrun's agent holds MASTER_PORT=%d for its own store, and ours takes the next port"},
    };
    for (size_t i = 0; i < sizeof from_env / sizeof from_env[0]; i++) {
        snprintf(env, sizeof env, "%s MASTER_PORT=%d", from_env[i].env, port - from_env[i].minus);
        snprintf(want, sizeof want, from_env[i].says, port - from_env[i].minus);
        ck_assert_int_eq(stage3(env, "--device cpu --model tiny --train-size 256 --rdzv-timeout 20", &out), 2);
        ck_assert_msg(strstr(out, "port is in use") && strstr(out, want) && !strstr(out, "with --master-port"),
                      "%s:\n%s", env, out);
        free(out);
    }
    close(fd);
    ck_assert_int_eq(stage3("RANK=0 WORLD_SIZE=2 TORCHELASTIC_RUN_ID=x TORCHELASTIC_USE_AGENT_STORE=True "
                            "MASTER_PORT=65535", "--device cpu --model tiny", &out), 2);
    ck_assert_msg(strstr(out, "port 65536 is out of range") && strstr(out, "MASTER_PORT=65535 for its own store") &&
                  strstr(out, "--master-port P below 65535"), "%s", out);
    free(out);
    /* and a worker whose peer never comes, started with torchrun's variables: the exported address and
     * port are named (--master-addr cannot override them) */
    snprintf(args, sizeof args, "--device cpu --model tiny --train-size 256 --rdzv-timeout 1");
    snprintf(env, sizeof env, "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=%d", test_free_port());
    ck_assert_int_eq(stage3(env, args, &out), 2);
    ck_assert_msg(strstr(out, "rank 1 did not join within 1 s — check MASTER_ADDR and MASTER_PORT (exported"), "%s",
                  out);
    free(out);
}
END_TEST

/* ---- the host ring --------------------------------------------------------------------------- */

/* Inputs whose sums are exact in float (small integers), so every rank must get exactly Σ. */
static float exact_input(int rank, int64_t i) { return (float)((rank * 7 + i * 3) % 17) - 8.0f; }

/* One rank of a host ring, as a thread: a CPU device, the store, the communicator. */
typedef struct HostRank {
    Device dev;
    Store *s;
    Comm *c;
} HostRank;

static void host_rank_open(HostRank *h, const RankArg *a) {
    *h = (HostRank){0};
    device_init(&h->dev, DEV_CPU, a->rank, 0);
    h->s = store_open("127.0.0.1", a->port, a->rank, a->world, 20);
    h->c = comm_create(COMM_HOST, h->s, &h->dev, 20);
}

static void host_rank_close(HostRank *h) {
    comm_destroy(h->c);
    store_close(h->s);
    device_destroy(&h->dev);
}

static void *ring_rank_main(void *p) {
    RankArg *a = p;
    HostRank hr;
    host_rank_open(&hr, a);
    Comm *c = hr.c;
    int64_t n = a->count;
    float *x = malloc((size_t)(n + 1) * sizeof(float)), *y = malloc((size_t)(n + 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = exact_input(a->rank, i);
    /* two operations in flight at once, on two buffers */
    test_fill_uniform(y, n, 100 + (uint64_t)a->rank, -1, 1);
    int64_t id = comm_allreduce_async(c, x, n);
    comm_allreduce_async(c, y, n);
    comm_wait(c);
    ck_assert(comm_op_ms(c, id) >= 0);
    for (int64_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < a->world; r++) want += exact_input(r, i);
        if (x[i] != want) {
            snprintf(a->msg, sizeof a->msg, "world %d, count %lld, rank %d: x[%lld] = %g, expected %g", a->world,
                     (long long)n, a->rank, (long long)i, x[i], want);
            return NULL;
        }
    }
    /* every rank ends with the same bits: sum the bit patterns' hash over ranks and compare */
    uint64_t h = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &y[i], 4);
        h = hash3(h, b, (uint64_t)i);
    }
    double v[3] = {(double)(h >> 40), (double)(h & 0xffffff), 1.0};
    double mine[3] = {v[0], v[1], v[2]};
    comm_sum_doubles(c, v, 3);
    if (v[0] != a->world * mine[0] || v[1] != a->world * mine[1] || v[2] != a->world) {
        snprintf(a->msg, sizeof a->msg, "world %d, count %lld: ranks ended with different bits", a->world, (long long)n);
        return NULL;
    }
    /* broadcast from the last rank */
    for (int64_t i = 0; i < n; i++) x[i] = a->rank == a->root ? (float)i : -1.0f;
    comm_broadcast_async(c, x, n, a->root);
    comm_wait(c);
    for (int64_t i = 0; i < n; i++)
        if (x[i] != (float)i) {
            snprintf(a->msg, sizeof a->msg, "broadcast from %d, world %d, rank %d: x[%lld] = %g", a->root, a->world,
                     a->rank, (long long)i, x[i]);
            return NULL;
        }
    host_rank_close(&hr);
    free(x), free(y);
    a->ok = 1;
    return NULL;
}

START_TEST(host_ring_allreduce_is_exact) {
    const int worlds[] = {1, 2, 3, 4, 5};
    const int64_t counts[] = {1, 3, 7, 1000, 100003}; /* fewer elements than ranks, and remainders */
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
            run_rank_threads(worlds[w], ring_rank_main,
                             (RankArg){.port = test_free_port(), .count = counts[k], .root = worlds[w] - 1});
}
END_TEST

/* The mean all-reduce in 16 bits (DDP's --grad-comm fp16 | bf16): each contribution is rounded once
 * from x · fp32(1/world), PyTorch's CUDA div_(world), then summed. Rank 0 holds x and the others
 * negative zeros, so the sum adds nothing and every rank must end with exactly precision_scale_stored(x) —
 * for world 3, where NCCL's own ncclAvg factor (1/3 rounded to 16 bits) would give other bits for
 * some elements: the test checks that its data has such elements, so it can tell the two apart. */
enum { MEAN16_N = 4096 };

static uint16_t mean16_input(int rank, int i, Precision p) {
    if (rank != 0) return 0x8000; /* -0 in both types: x + -0 is x for every x, +0 and -0 included */
    float v = (float)ldexp(1.0 + (double)((i * 2654435761u) % 1000) / 1000.0, (i % 40) - 30); /* 2^-30 … 2^9 */
    if (i % 2) v = -v;
    return p == PREC_FP16 ? f32_to_f16(v) : f32_to_bf16(v); /* fp16: subnormals below 2^-14 too */
}

static void *mean16_rank_main(void *p) {
    RankArg *a = p;
    HostRank hr;
    host_rank_open(&hr, a);
    for (int t = 0; t < 2; t++) {
        Precision prec = t ? PREC_BF16 : PREC_FP16;
        uint16_t x[MEAN16_N], want[MEAN16_N];
        for (int i = 0; i < MEAN16_N; i++) x[i] = want[i] = mean16_input(a->rank, i, prec);
        for (int i = 0; i < MEAN16_N; i++) want[i] = mean16_input(0, i, prec);
        precision_scale_stored(prec, MEAN16_N, want, 1.0f / (float)a->world);
        comm_allreduce_mean_async(hr.c, x, MEAN16_N, prec == PREC_FP16 ? COMM_F16 : COMM_BF16);
        comm_wait(hr.c);
        for (int i = 0; i < MEAN16_N; i++)
            if (x[i] != want[i]) {
                snprintf(a->msg, sizeof a->msg, "%s, world %d, rank %d: element %d is 0x%04x, expected 0x%04x",
                         precision_name(prec), a->world, a->rank, i, x[i], want[i]);
                return NULL;
            }
    }
    /* Every rank the same fp16 values: divided before the sum, as the hook does, 40000 stays 40000
     * (summed first it would pass 65504: inf) and 2^-24 becomes 0 on every rank (its half rounds to
     * zero) — summed first, it would stay 2^-24. */
    uint16_t y[2] = {f32_to_f16(40000.0f), f32_to_f16(0x1p-24f)};
    comm_allreduce_mean_async(hr.c, y, 2, COMM_F16);
    comm_wait(hr.c);
    if (!(fabsf(f16_to_f32(y[0]) - 40000.0f) <= 32.0f) || y[1] != 0) {
        snprintf(a->msg, sizeof a->msg, "fp16, world %d, rank %d: the mean of 40000 and of 2^-24 on every rank is "
                 "%g and %g, expected 40000 and 0 (divide, then sum)", a->world, a->rank, f16_to_f32(y[0]),
                 f16_to_f32(y[1]));
        return NULL;
    }
    host_rank_close(&hr);
    a->ok = 1;
    return NULL;
}

START_TEST(host_ring_16bit_mean_is_pytorchs) {
    /* which factor ncclAvg may keep: fp32 always; 16 bits only where 1/world is exact */
    ck_assert(comm_avg_is_exact(3, COMM_F32) && comm_avg_is_exact(2, COMM_BF16) && comm_avg_is_exact(8, COMM_F16));
    ck_assert(!comm_avg_is_exact(3, COMM_BF16) && !comm_avg_is_exact(6, COMM_F16) && !comm_avg_is_exact(7, COMM_BF16));
    for (int t = 0; t < 2; t++) { /* the data tells the rounded factor apart from fp32's */
        Precision prec = t ? PREC_BF16 : PREC_FP16;
        float f16 = precision_round(prec, 1.0f / 3.0f);
        int differ = 0;
        for (int i = 0; i < MEAN16_N; i++) {
            uint16_t h = mean16_input(0, i, prec), ours = h, nccl;
            precision_scale_stored(prec, 1, &ours, 1.0f / 3.0f);
            float v = (prec == PREC_FP16 ? f16_to_f32(h) : bf16_to_f32(h)) * f16;
            nccl = prec == PREC_FP16 ? f32_to_f16(v) : f32_to_bf16(v);
            differ += ours != nccl;
        }
        ck_assert_msg(differ > 100, "%s: only %d of %d elements tell 1/3 in fp32 from 1/3 rounded to 16 bits",
                      precision_name(prec), differ, MEAN16_N);
    }
    const int worlds[] = {2, 3, 5};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++)
        run_rank_threads(worlds[w], mean16_rank_main, (RankArg){.port = test_free_port()});
}
END_TEST

/* The fp32 mean all-reduce, DDP's gradient averaging (no hook): the reducer multiplies each rank's
 * gradients by fp32's 1/world as it copies them into the bucket (reducer.cpp, mark_variable_ready_dense:
 * at::mul(grad, 1/div_factor_)) and the bucket is then SUM all-reduced — each contribution rounded on
 * its own, not the sum divided. Rank 0 holds a, rank 1 b, the others −0, so only one addition rounds
 * and its order cannot matter: every rank must end with exactly fp32(a·w) + fp32(b·w), w = fp32(1/world).
 * The data tells that apart from a mean taken after the sum, multiplied or divided (the test checks it
 * has such elements), and holds ±3e38 pairs whose sum overflows before the division, not after it. */
enum { MEAN32_N = 4096 };

static float mean32_input(int rank, int i) {
    if (rank > 1) return -0.0f;
    if (i < 2) return i ? -3e38f : 3e38f; /* a + b = ±6e38: inf when summed first */
    uint32_t u = (uint32_t)i * 2654435761u + (uint32_t)rank * 40503u;
    float v = ldexpf(1.0f + (float)(u % 8388608u) / 8388608.0f, (int)((u >> 23) % 60) - 30);
    return (u >> 7) & 1 ? -v : v;
}

static void *mean32_rank_main(void *p) {
    RankArg *a = p;
    HostRank hr;
    host_rank_open(&hr, a);
    const float w = 1.0f / (float)a->world;
    float *x = malloc(MEAN32_N * sizeof(float));
    for (int i = 0; i < MEAN32_N; i++) x[i] = mean32_input(a->rank, i);
    comm_allreduce_mean_async(hr.c, x, MEAN32_N, COMM_F32);
    comm_wait(hr.c);
    for (int i = 0; i < MEAN32_N; i++) {
        volatile float qa = mean32_input(0, i) * w, qb = mean32_input(1, i) * w, want = qa + qb;
        if (memcmp(&x[i], (const float *)&want, sizeof(float))) {
            snprintf(a->msg, sizeof a->msg, "world %d, rank %d: element %d is %.9g, expected %.9g (each contribution "
                     "times 1/world, then summed)", a->world, a->rank, i, x[i], want);
            free(x);
            return NULL;
        }
    }
    free(x);
    host_rank_close(&hr);
    a->ok = 1;
    return NULL;
}

START_TEST(host_ring_f32_mean_is_pytorchs) {
    /* the data tells "times 1/world, then sum" from "sum, then times 1/world" and "sum, then / world" */
    const float w3 = 1.0f / 3.0f;
    int after_mul = 0, after_div = 0;
    for (int i = 0; i < MEAN32_N; i++) {
        volatile float a = mean32_input(0, i), b = mean32_input(1, i), qa = a * w3, qb = b * w3, want = qa + qb,
                       sum = a + b, mul = sum * w3, div = sum / 3.0f;
        after_mul += memcmp((const float *)&mul, (const float *)&want, sizeof(float)) != 0;
        after_div += memcmp((const float *)&div, (const float *)&want, sizeof(float)) != 0;
    }
    ck_assert_msg(after_mul > 100 && after_div > 100, "only %d / %d of %d elements tell the orders apart", after_mul,
                  after_div, MEAN32_N);
    const int worlds[] = {2, 3, 5};
    for (size_t k = 0; k < sizeof worlds / sizeof worlds[0]; k++)
        run_rank_threads(worlds[k], mean32_rank_main, (RankArg){.port = test_free_port()});
}
END_TEST

/* A communicator remembers its last OPS operations in a ring of slots. When a peer stalls, a rank
 * can issue OPS operations ahead of it; the next one must wait for the oldest to finish, not reuse
 * its slot while it is still in flight. Rank 1 starts 0.5 s late; rank 0 issues OPS + 8 small
 * all-reduces at once. Its first OPS issues return at once, the next blocks until rank 1 arrives,
 * and every sum comes out exact. */
enum { SLOT_EXTRA = 8, SLOT_FLOATS = 4 };
static const double SLOT_LATE_S = 0.5;

static void *slot_rank_main(void *p) {
    RankArg *a = p;
    HostRank hr;
    host_rank_open(&hr, a);
    Comm *c = hr.c;
    const int n_ops = OPS + SLOT_EXTRA;
    float *x = malloc((size_t)n_ops * SLOT_FLOATS * sizeof(float));
    for (int64_t i = 0; i < (int64_t)n_ops * SLOT_FLOATS; i++) x[i] = exact_input(a->rank, i);
    if (a->rank == 1) usleep((useconds_t)(SLOT_LATE_S * 1e6));
    double t0 = time_now(), t_full = 0, t_next = 0;
    for (int k = 0; k < n_ops; k++) {
        comm_allreduce_async(c, x + (int64_t)k * SLOT_FLOATS, SLOT_FLOATS);
        if (k == OPS - 1) t_full = time_now() - t0;
        if (k == OPS) t_next = time_now() - t0;
    }
    comm_wait(c);
    if (a->rank == 0 && (t_full > 0.5 * SLOT_LATE_S || t_next < 0.5 * SLOT_LATE_S)) {
        snprintf(a->msg, sizeof a->msg, "rank 0 issued %d operations in %.3f s and the next at %.3f s: the next "
                 "should wait for the late rank (%.1f s), the first ones not", OPS, t_full, t_next, SLOT_LATE_S);
        return NULL;
    }
    for (int64_t i = 0; i < (int64_t)n_ops * SLOT_FLOATS; i++) {
        float want = exact_input(0, i) + exact_input(1, i);
        if (x[i] != want) {
            snprintf(a->msg, sizeof a->msg, "rank %d: operation %lld, element %lld = %g, expected %g", a->rank,
                     (long long)(i / SLOT_FLOATS), (long long)(i % SLOT_FLOATS), x[i], want);
            return NULL;
        }
    }
    host_rank_close(&hr);
    free(x);
    a->ok = 1;
    return NULL;
}

START_TEST(host_ring_issue_waits_for_a_free_slot) {
    run_rank_threads(2, slot_rank_main, (RankArg){.port = test_free_port()});
}
END_TEST

#ifdef USE_NCCL /* the helpers of the test below, which needs a build with NCCL */
/* Rank 1 asks for an NCCL communicator while rank 0 builds a host ring (--device or --comm given
 * differently on two nodes): each used to wait for the other's half of a different handshake.
 * comm_create compares the kinds first and refuses, naming both (the dying thread ends the child). */
static void *kind_rank_main(void *p) {
    RankArg *a = p;
    Device dev = {0};
    device_init(&dev, DEV_CPU, a->rank, 0);
    Store *s = store_open("127.0.0.1", a->port, a->rank, a->world, 20);
    comm_create(a->rank == 0 ? COMM_HOST : COMM_NCCL, s, &dev, 20);
    return NULL;
}

static void two_kinds(void *arg) {
    (void)arg;
    pthread_t t[2];
    RankArg a[2];
    int port = test_free_port();
    for (int r = 0; r < 2; r++) {
        a[r] = (RankArg){.rank = r, .world = 2, .port = port};
        pthread_create(&t[r], NULL, kind_rank_main, &a[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
}
#endif

START_TEST(ranks_on_different_communicators_are_refused) {
#ifdef USE_NCCL
    char *out;
    double t0 = time_now();
    int rc = test_run_captured(two_kinds, NULL, &out);
    ck_assert_msg(rc == 2 && strstr(out, "communicates over") && strstr(out, "NCCL (a GPU worker)") &&
                      strstr(out, "the host ring (a CPU worker, or --comm host)") &&
                      strstr(out, "start every rank with the same --device and --comm"),
                  "exit %d:\n%s", rc, out);
    ck_assert_msg(time_now() - t0 < 15 * test_time_scale(), "took %.1f s", time_now() - t0);
    free(out);
#else
    printf("SKIP: dist: an NCCL rank beside a host-ring rank — this build has no NCCL\n");
#endif
}
END_TEST

/* comm_sum_doubles over NCCL stages the doubles through a device scratch of 512: a longer vector —
 * peaks_of's, one peak-memory value per rank, at the end of every run of more than 512 GPU ranks
 * (STORE_MAX_WORLD allows 4096) — failed its ASSERT(n <= 512), every rank at once. A world of one
 * suffices to send that many through the backend (comm_sum_doubles itself skips one rank). */
START_TEST(nccl_sums_more_doubles_than_its_scratch) {
#ifdef USE_NCCL
    if (!test_have_gpu("dist: NCCL sum of more than 512 doubles")) return;
    Device dev = {0};
    device_init(&dev, DEV_CUDA, 0, 0);
    Store *s = store_open("127.0.0.1", test_free_port(), 0, 1, 20);
    Comm *c = comm_create(COMM_NCCL, s, &dev, 20);
    enum { N = STORE_MAX_WORLD + 3 };
    double *v = malloc(N * sizeof *v);
    for (int i = 0; i < N; i++) v[i] = i + 0.5;
    c->be->sum_doubles(c, v, N);
    for (int i = 0; i < N; i++) ck_assert_msg(v[i] == i + 0.5, "v[%d] = %g, expected %g", i, v[i], i + 0.5);
    free(v);
    comm_destroy(c);
    store_close(s);
    device_destroy(&dev);
#else
    printf("SKIP: dist: NCCL sum of more than 512 doubles — this build has no NCCL\n");
#endif
}
END_TEST

/* ---- the launcher ---------------------------------------------------------------------------- */

#define TINY "--device cpu --model tiny --train-size 256 --test-size 64 --batch-size 16 --progress off"

START_TEST(launcher_refuses_bad_flags) {
    struct { const char *args, *expect; } cases[] = {
        {"--nproc-per-node 0", "--nproc-per-node"},
        {"--nproc-per-node two", "--nproc-per-node"},
        {"--bucket-mb 0", "--bucket-mb"},
        {"--comm gloo", "--comm"},
        {"--master-port 70000", "--master-port"},
        {"--device cpu --comm nccl", "--comm host"},
        {"--device cpu --nnodes 2 --node-rank 2", "--node-rank"},
        {"--show-sampler --world-size 2 --rank 2 --dataset-size 5", "--rank"},
        {"--show-sampler --world-size 2", "--dataset-size"},
        /* 8 TB of permutation: refused with the figures, not killed by the kernel as the pages fill */
        {"--show-sampler --dataset-size 1000000000000", "needs 14901.2 GiB of host memory"},
        /* a flag the lesson does not read: refused, not silently ignored */
        {"--show-sampler --dataset-size 10 --world-size 2 --rank 1 --resume /nonexistent",
         "--resume is not read by --show-sampler"},
        /* several: named in one refusal, not one per run */
        {"--show-sampler --dataset-size 10 --lr 0.5 --world-size 2 --epochs 3 --bucket-mb 5",
         "--lr --epochs --bucket-mb are not read by --show-sampler, which prints one rank's sample indices and "
         "exits: drop them"},
        {"--device cpu --report /nonexistent/dir/r.jsonl", "/nonexistent/dir"},
        /* the sampler lesson's flags in a training run: refused, where they used to be ignored */
        {"--device cpu --world-size 4", "--world-size only applies to --show-sampler"},
        {"--device cpu --epoch 3", "use --epochs N"},
        {"--device cpu --rank 1", "--rank only applies"},
        {"--device cpu --dataset-size 10", "--dataset-size only applies"},
        {"--device cpu --trace-steps 1:2", "give --trace FILE too"},
        {"--device cpu --nnodes 4097 --nproc-per-node 1", "is 4097 ranks: a job has at most 4096"},
        /* 2.8 TB of images in each worker: refused once, with the figures, where each worker said so */
        {"--device cpu --train-size 900000000", "2 workers need 5151.5 GiB, more than the"},
        {"--device cpu --nproc-per-node 1 --train-size 900000000", "1 worker needs 2575.8 GiB"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int rc = stage3(NULL, cases[i].args, &out);
        ck_assert_msg(rc == 2, "'%s' exited %d, expected 2:\n%s", cases[i].args, rc, out);
        ck_assert_msg(strstr(out, "error:") && strstr(out, cases[i].expect), "'%s': message lacks '%s':\n%s",
                      cases[i].args, cases[i].expect, out);
        ck_assert_msg(!strstr(out, "launching"), "'%s' started workers before refusing:\n%s", cases[i].args, out);
        free(out);
    }
    char *out;
    /* far more CPU workers than cores: refused before any starts (1000 on 2 cores all timed out) */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (LAUNCH_CPU_WORKERS_PER_CORE * cores < 1024) {
        char many[96];
        snprintf(many, sizeof many, "--device cpu --nproc-per-node %ld", LAUNCH_CPU_WORKERS_PER_CORE * cores + 1);
        ck_assert_int_eq(stage3(NULL, many, &out), 2);
        ck_assert_msg(strstr(out, "would starve one another") && !strstr(out, "launching"), "%s\n%s", many, out);
        free(out);
    }
    /* RANK without WORLD_SIZE is an incomplete torchrun environment, and so is WORLD_SIZE without RANK
     * (it used to be ignored: 2 workers started); each names what is missing */
    static const struct { const char *env, *says; } partial[] = {
        {"RANK=0", "RANK=0 is set, but not WORLD_SIZE"},
        {"WORLD_SIZE=4", "WORLD_SIZE=4 is set, but not RANK: a worker needs both"},
        {"LOCAL_RANK=1 GROUP_RANK=0", "are set, but not RANK and WORLD_SIZE"},
        {"OMPI_COMM_WORLD_SIZE=2", "is set, but not OMPI_COMM_WORLD_RANK"},
    };
    for (size_t i = 0; i < sizeof partial / sizeof partial[0]; i++) {
        ck_assert_int_eq(stage3(partial[i].env, TINY, &out), 2);
        ck_assert_msg(strstr(out, partial[i].says) && strstr(out, "to let stage3 start its own workers") &&
                      !strstr(out, "launching"), "%s:\n%s", partial[i].env, out);
        free(out);
    }
    /* started by another launcher, a contradicting --nproc-per-node is named, not ignored; the same
     * variables left over in a shell, no launcher's, are named with how to be rid of them — with the
     * flag, and without it (where the one-rank job lacked a secret, and the message said only that) */
    ck_assert_int_eq(stage3("RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1", TINY " --nproc-per-node 4", &out), 2);
    ck_assert_msg(strstr(out, "this node runs 1 worker") && strstr(out, "drop --nproc-per-node") &&
                  strstr(out, "from RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 in the environment") &&
                  strstr(out, "unset RANK WORLD_SIZE LOCAL_WORLD_SIZE to let stage3 start its own workers"), "%s", out);
    free(out);
    ck_assert_int_eq(stage3("env -u STAGE_RDZV_SECRET RANK=0 WORLD_SIZE=1", TINY, &out), 2);
    ck_assert_msg(strstr(out, "rank 0 of 1 (from RANK=0 WORLD_SIZE=1 in the environment") &&
                  strstr(out, "no rendezvous secret") && strstr(out, "unset RANK WORLD_SIZE to let stage3"), "%s", out);
    free(out);
    /* with a secret exported (the multi-node recipe) the same leftovers start a worker: named at once.
     * Rank 0 then hosts the store: on a port of its own, since the default may be another suite's. */
    char one[512];
    snprintf(one, sizeof one, TINY " --steps 1 --master-port %d", test_free_port());
    ck_assert_int_eq(stage3("RANK=0 WORLD_SIZE=1", one, &out), 0);
    ck_assert_msg(strstr(out, "note: this process is rank 0 of 1 (from RANK=0 WORLD_SIZE=1 in the environment") &&
                  strstr(out, "unset RANK WORLD_SIZE to let stage3 start its own workers"), "%s", out);
    free(out);
    ck_assert_int_eq(stage3("RANK=0 WORLD_SIZE=1 TORCHELASTIC_RUN_ID=x", TINY " --nproc-per-node 4", &out), 2);
    ck_assert_msg(strstr(out, "from torchrun's variables RANK=0 WORLD_SIZE=1)") &&
                  strstr(out, "the launcher decides: drop --nproc-per-node") && !strstr(out, "unset"), "%s", out);
    free(out);
    /* and so are the other launch flags it decides, and variables that contradict each other */
    struct { const char *env, *args, *expect; } env_cases[] = {
        {"RANK=0 WORLD_SIZE=1 MASTER_PORT=29742", " --master-port 29743", "drop --master-port"},
        /* srun sets no MASTER_PORT: the job script did, and the message says where to change it */
        {"SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 MASTER_PORT=29742",
         " --master-port 29743", "your job script exported to every rank (change the port there)"},
        {"RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1", " --master-addr 127.0.0.2", "drop --master-addr"},
        {"RANK=0 WORLD_SIZE=1", " --nnodes 7", "drop --nnodes"},
        {"RANK=0 WORLD_SIZE=2 GROUP_RANK=0", " --node-rank 1", "drop --node-rank"},
        {"RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=4", "", "a node cannot hold more workers than the job"},
        {"OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_LOCAL_SIZE=3", "", "cannot hold more"},
    };
    for (size_t i = 0; i < sizeof env_cases / sizeof env_cases[0]; i++) {
        char args[512];
        snprintf(args, sizeof args, TINY "%s", env_cases[i].args);
        ck_assert_int_eq(stage3(env_cases[i].env, args, &out), 2);
        ck_assert_msg(strstr(out, env_cases[i].expect), "%s%s:\n%s", env_cases[i].env, env_cases[i].args, out);
        free(out);
    }
    if (device_cuda_count() == 0) {
        ck_assert_int_eq(stage3(NULL, "--device cuda", &out), 2);
        ck_assert_msg(strstr(out, "--device cpu"), "%s", out);
        free(out);
    }
}
END_TEST

/* Processes whose command line contains `marker` (unique per test), other than ourselves. */
static int processes_with(const char *marker) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        int pid = atoi(e->d_name);
        if (pid <= 0 || pid == getpid()) continue;
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < len; i++)
            if (!buf[i]) buf[i] = ' ';
        buf[len] = 0;
        if (strstr(buf, marker) && !strstr(buf, "sh -c")) n++;
    }
    closedir(d);
    return n;
}

START_TEST(launcher_stops_everyone_when_a_rank_fails) {
    struct { const char *fail, *expect; int nproc; } cases[] = {
        {"STAGE3_FAIL_AT=1:3", "rank 1 (local rank 1", 2},          /* exits with code 3 */
        {"STAGE3_FAIL_AT=2:4:KILL", "rank 2 (local rank 2", 3},     /* killed by a signal */
        {"STAGE3_FAIL_AT=0:2", "rank 0 (local rank 0", 3},          /* the store's host fails */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[512], marker[64], *out;
        /* a seed unique to this test process marks its workers, even beside another test run */
        snprintf(marker, sizeof marker, "--seed %d", (int)(getpid() % 100000) * 10 + (int)i);
        snprintf(args, sizeof args, TINY " --epochs 50 --nproc-per-node %d --master-port %d %s", cases[i].nproc,
                 test_free_port(), marker);
        double t0 = time_now();
        int rc = stage3(cases[i].fail, args, &out);
        double took = time_now() - t0;
        ck_assert_msg(rc != 0 && rc != 124, "%s: exit %d\n%s", cases[i].fail, rc, out);
        ck_assert_msg(took < 10 * test_time_scale(), "%s: the job took %.1f s to stop", cases[i].fail, took);
        ck_assert_msg(strstr(out, "job failed: ") && strstr(out, cases[i].expect), "%s: root cause not named:\n%s",
                      cases[i].fail, out);
        ck_assert_msg(strstr(out, "at step "), "%s: step not named:\n%s", cases[i].fail, out);
        /* the injected SIGKILL is named as such, not blamed on the OOM killer (that hint is for a SIGKILL
         * from outside: a_failure_waits_for_the_checkpoint_being_written's kill -9) */
        int injected = strstr(cases[i].fail, ":KILL") != NULL;
        ck_assert_msg(!strstr(out, "out-of-memory killer") &&
                          !!strstr(out, "note: STAGE3_FAIL_AT (test-only) made it raise this signal") == injected,
                      "%s: the signal's note is wrong:\n%s", cases[i].fail, out);
        ck_assert_msg(processes_with(marker) == 0, "%s: processes left behind", cases[i].fail);
        free(out);
    }
}
END_TEST

/* `./stage3 | head`: rank 0 dies of the closed pipe and says why (cli.c). Rank 1, which then loses its
 * peer, dies of the same pipe without a word, and the launcher says only that it stopped the workers
 * for it: no "connection reset" from rank 1 and no "job failed", which sent the reader after a failure
 * that did not happen. Both while the ranks set up (the first line) and while they train. */
START_TEST(a_closed_output_stops_the_job_quietly) {
    const int lines[] = {1, 12};
    for (int i = 0; i < 2; i++) {
        char cmd[2048], marker[64], *out;
        snprintf(marker, sizeof marker, "--seed %d", (int)(getpid() % 100000) * 10 + i);
        snprintf(cmd, sizeof cmd, "{ { " LIMIT "%s/stage3 " TINY " --epochs 50 --log-every 1 --standalone %s 2>&3; "
                 "echo \"exit $?\" >&3; } | head -n %d > /dev/null; } 3>&1", test_root(), marker, lines[i]);
        test_run(cmd, &out);
        ck_assert_msg(strstr(out, "exit 141"), "head -n %d: not ended by SIGPIPE:\n%s", lines[i], out);
        ck_assert_msg(strstr(out, "stage3: stopped — the program reading its output went away (SIGPIPE") &&
                          strstr(out, "stage3: stopped all 2 workers: rank 0's output was closed (SIGPIPE"),
                      "head -n %d: the stop is not explained:\n%s", lines[i], out);
        ck_assert_msg(!strstr(out, "error") && !strstr(out, "failed"), "head -n %d: a failure reported:\n%s", lines[i],
                      out);
        ck_assert_msg(processes_with(marker) == 0, "head -n %d: processes left behind", lines[i]);
        free(out);
    }
}
END_TEST

/* A rank that dies while rank 0 writes a checkpoint: the launcher stops every worker, but the state
 * being written is complete (every rank finished that epoch), so rank 0 finishes the file first and
 * then stops (stop.h). Before, the launcher's SIGTERM killed it mid-write and the epoch was lost.
 * STAGE3_SAVE_DELAY_MS holds the write open; rank 1 is killed inside that window, which lasts 2 s
 * longer than the launcher's LAUNCH_GRACE_S before its SIGKILL: only the status page's saving mark
 * makes the launcher wait that long (up to LAUNCH_SAVE_S). */
START_TEST(a_failure_waits_for_the_checkpoint_being_written) {
    char *dir = test_tmpdir(), cmd[4096], *out;
    int seed = (int)(getpid() % 100000) * 10 + 8;
    snprintf(cmd, sizeof cmd,
             "D=%s; { STAGE3_SAVE_DELAY_MS=%d " LIMIT "%s/stage3 " TINY " --epochs 2 --nproc-per-node 2 "
             "--master-port %d --seed %d --save $D/ck > $D/out.txt 2>&1; echo \"exit $?\" >> $D/out.txt; } & "
             "for i in $(seq 1 2400); do grep -q '^epoch 1/2' $D/out.txt 2>/dev/null && break; sleep 0.05; done; "
             "sleep 0.5; "
             "for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline | grep -q -- '--seed %d ' || continue; "
             "tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx RANK=1 && kill -9 ${p#/proc/}; done; "
             "wait; cat $D/out.txt",
             dir, (int)((LAUNCH_GRACE_S + 2) * 1000 * test_time_scale()), test_root(), test_free_port(), seed, seed);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "exit 137") && strstr(out, "job failed: rank 1 (local rank 1"),
                  "rank 1 killed during the save: the job must fail on it (exit 137):\n%s", out);
    /* …and where it was: not in its last step, which had finished, but waiting at the epoch's end for
     * rank 0's write (the status page's epoch_end mark) */
    ck_assert_msg(strstr(out, "was killed by signal 9 (SIGKILL) after step ") &&
                      strstr(out, ", evaluating or at the epoch's checkpoint"),
                  "rank 1 died at the epoch's end, not in a step:\n%s", out);
    /* a SIGKILL the launcher did not send: most often the kernel's OOM killer, and the hint says so */
    ck_assert_msg(strstr(out, "most often the kernel's out-of-memory killer"), "%s", out);
    ck_assert_msg(strstr(out, "saved checkpoint ") && strstr(out, "/ck/epoch001.ckpt\n") && strstr(out, "stopping now"),
                  "rank 0 must finish the checkpoint it was writing, then stop:\n%s", out);
    char path[1200];
    snprintf(path, sizeof path, "%s/ck/epoch001.ckpt.tmp", dir);
    ck_assert_msg(access(path, F_OK) != 0, "a partial checkpoint was left: %s", path);
    free(out);
    /* and it is whole: the job resumes from it and trains epoch 2 */
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage3 " TINY " --epochs 2 --nproc-per-node 2 --master-port %d --seed %d "
             "--resume %s/ck/epoch001.ckpt", test_root(), test_free_port(), seed, dir);
    rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "epoch 2/2"), "resume from the saved epoch (exit %d):\n%s", rc, out);
    free(out), free(dir);
}
END_TEST

/* A launcher started with SIGCHLD ignored — some job wrappers do it, and exec keeps it — must still
 * see its workers exit: the failure is reported as one (exit 3, the root cause named), not as a
 * success. The shell resets SIGCHLD, so the launcher is exec'd directly from a forked child. */
START_TEST(launcher_reports_failure_with_sigchld_ignored) {
    char exe[4096], port[16], seed[16], log[] = "/tmp/stage3_sigchld_XXXXXX";
    snprintf(exe, sizeof exe, "%s/stage3", test_root());
    snprintf(port, sizeof port, "%d", test_free_port());
    snprintf(seed, sizeof seed, "%d", (int)(getpid() % 100000) * 10 + 7);
    int fd = mkstemp(log);
    ck_assert_int_ge(fd, 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fd, 1), dup2(fd, 2);
        signal(SIGCHLD, SIG_IGN);
        setenv("STAGE3_FAIL_AT", "1:3", 1);
        alarm((unsigned)(120 * test_time_scale())); /* survives exec: a hung launcher dies of it */
        execl(exe, "stage3", "--device", "cpu", "--model", "tiny", "--train-size", "256", "--test-size", "64",
              "--batch-size", "16", "--progress", "off", "--epochs", "50", "--nproc-per-node", "2",
              "--master-port", port, "--seed", seed, (char *)NULL);
        _exit(127);
    }
    close(fd);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    char *out = test_slurp(log, NULL);
    unlink(log);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 3, "status %#x (expected exit 3):\n%s", st, out);
    ck_assert_msg(strstr(out, "job failed: ") && strstr(out, "rank 1 (local rank 1"), "root cause not named:\n%s",
                  out);
    char marker[32];
    snprintf(marker, sizeof marker, "--seed %s", seed);
    ck_assert_msg(processes_with(marker) == 0, "processes left behind");
    free(out);
}
END_TEST

/* STAGE3_FAIL_AT=RANK:STEP[:SIGNAL], the failure tests' fault injection, on its own: a worker (a
 * forked child here, with no status page) of that rank fails at that step — exit 3, or the signal,
 * named with or without SIG — and every other rank or step goes on; a value it cannot read stops the
 * worker with exit 2 and says what it expects, rather than injecting nothing. */
typedef struct FailAt { const char *env; int rank; } FailAt;

static void fail_at_child(void *arg) {
    const FailAt *f = arg;
    setenv("STAGE3_FAIL_AT", f->env, 1);
    status_attach(-1, f->rank, f->rank);
    for (int64_t step = 1; step <= 5; step++) launch_step(step);
}

START_TEST(fail_at_injects_where_it_says) {
    struct { FailAt f; int status; const char *says; } cases[] = {
        {{"1:3", 1}, 3, "rank 1: failing on purpose at step 3"},
        {{"1:3", 0}, 0, NULL},
        {{"0:9", 0}, 0, NULL},
        {{"2:4:KILL", 2}, 128 + SIGKILL, NULL},
        {{"2:4:SIGTERM", 2}, 128 + SIGTERM, "failing on purpose at step 4"},
        {{"1:0", 1}, 2, "expected RANK:STEP"},
        {{"-1:3", 0}, 2, "expected RANK:STEP"},
        {{"3", 3}, 2, "expected RANK:STEP"},
        {{"1:3:BOGUS", 1}, 2, "unknown signal 'BOGUS'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        int st = test_run_captured(fail_at_child, &cases[i].f, &out);
        ck_assert_msg(st == cases[i].status, "STAGE3_FAIL_AT=%s on rank %d: status %d, expected %d:\n%s",
                      cases[i].f.env, cases[i].f.rank, st, cases[i].status, out);
        ck_assert_msg(!cases[i].says || strstr(out, cases[i].says), "STAGE3_FAIL_AT=%s: %s", cases[i].f.env, out);
        free(out);
    }
}
END_TEST

/* With --device auto (the default) and no GPU visible, rank 0 of each DDP stage says the job fell back
 * to the CPU backend, and how many workers; asked for the CPU (--device cpu), it has nothing to explain. */
START_TEST(cpu_fallback_is_noted_only_under_auto) {
    if (device_cuda_count() > 0) {
        printf("SKIP: dist: the CPU fallback note — a CUDA device is visible, so --device auto picks it\n");
        return;
    }
    const char *stages[] = {"stage3", "stage4", "stage5"};
    for (int i = 0; i < 3; i++)
        for (int cpu = 0; cpu < 2; cpu++) {
            char cmd[1024], *out;
            snprintf(cmd, sizeof cmd, LIMIT "%s/%s%s --model tiny --train-size 64 --test-size 32 --batch-size 16 "
                     "--epochs 1 --progress off --nproc-per-node 2 --master-port %d", test_root(), stages[i],
                     cpu ? " --device cpu" : "", test_free_port());
            ck_assert_msg(test_run(cmd, &out) == 0, "%s\n%s", cmd, out);
            int noted = strstr(out, "note: no CUDA GPU visible — 2 CPU workers on the CPU backend") != NULL;
            ck_assert_msg(noted == !cpu, "%s %s: the CPU fallback note %s\n%s", stages[i],
                          cpu ? "--device cpu" : "--device auto", noted ? "printed" : "missing", out);
            free(out);
        }
}
END_TEST

/* The signal side of a clean stop (stop.c) on its own, in a forked worker with a status page of one
 * slot, each signal raised in turn: a SIGINT that was ignored when the worker started (a script's
 * `cmd &`) stays ignored; the first SIGTERM is a request (stop_requested, the page's `stopping` mark the
 * launcher waits on, the notice); the same signal again, with the launcher's token for it on the page
 * (a scheduler's SIGTERM to every process, passed on by the launcher too), is no second signal and
 * uses the token up; one more is a second signal: the worker dies of it at once. */
/* This process as worker 0 of a status page of one slot (what a launcher would have made): the page. */
static StatusSlot *attach_one_slot_page(void) {
    int fd;
    StatusSlot *page = status_page_create(1, &fd);
    status_attach(fd, 0, 0);
    return page;
}

static void stop_signals_child(void *arg) {
    (void)arg;
    StatusSlot *page = attach_one_slot_page();
    signal(SIGINT, SIG_IGN);
    stop_install("w", "stopping after this step");
    raise(SIGINT);
    fprintf(stderr, "after SIGINT: requested %d\n", stop_requested());
    raise(SIGTERM);
    fprintf(stderr, "after SIGTERM: requested %d, stopping %lld\n", stop_requested(),
            (long long)__atomic_load_n(&page[0].stopping, __ATOMIC_SEQ_CST));
    __atomic_store_n(&page[0].passed, SIGTERM, __ATOMIC_SEQ_CST); /* as launch.c's pass_signal_on */
    raise(SIGTERM);
    fprintf(stderr, "passed on: token %lld\n", (long long)__atomic_load_n(&page[0].passed, __ATOMIC_SEQ_CST));
    raise(SIGTERM);
    fprintf(stderr, "still running after a second SIGTERM\n");
}

START_TEST(stop_signals_request_pass_and_second) {
    char *out = NULL, want[64];
    int st = test_run_captured(stop_signals_child, NULL, &out);
    ck_assert_msg(st == 128 + SIGTERM, "status %d, expected death by SIGTERM (%d):\n%s", st, 128 + SIGTERM, out);
    ck_assert_msg(strstr(out, "after SIGINT: requested 0\n") && !strstr(out, "SIGINT —"),
                  "a SIGINT ignored at the start was acted on:\n%s", out);
    snprintf(want, sizeof want, "after SIGTERM: requested %d, stopping %d\n", SIGTERM, SIGTERM);
    ck_assert_msg(strstr(out, want) && strstr(out, "w: SIGTERM — stopping after this step"),
                  "the first SIGTERM is not a marked request:\n%s", out);
    ck_assert_msg(strstr(out, "passed on: token 0\n"), "the launcher's token was not taken once:\n%s", out);
    ck_assert_msg(!strstr(out, "still running"), "a second SIGTERM did not stop the worker at once:\n%s", out);
    free(out);
}
END_TEST

/* One request sent twice is one request (stop.c): GNU timeout passes a signal on to its child, then to
 * its process group, and two SIGINTs a moment apart used to be a second Ctrl-C — the run stopped at
 * once, unsaved (test_cli's Ctrl-C test, now and then). The same signal from the same process within
 * a second is the same request; from another process, or from the same one later, it is a second. */
static void kill_self_twice_child(void *arg) {
    double gap_s = *(double *)arg;
    stop_install("w", "stopping after this step");
    kill(getpid(), SIGINT); /* delivered before kill returns: this process has one thread */
    struct timespec ts = {(time_t)gap_s, (long)((gap_s - (time_t)gap_s) * 1e9)};
    nanosleep(&ts, NULL);
    kill(getpid(), SIGINT);
    fprintf(stderr, "after two kills from one process: requested %d\n", stop_requested());
    pid_t other = fork();
    if (other == 0) {
        kill(getppid(), SIGINT);
        _exit(0);
    }
    waitpid(other, NULL, 0);
    fprintf(stderr, "still running after a kill from another process\n");
}

START_TEST(a_signal_sent_twice_is_one_request) {
    char *out = NULL, want[64];
    double gap = 0;
    int st = test_run_captured(kill_self_twice_child, &gap, &out);
    snprintf(want, sizeof want, "after two kills from one process: requested %d\n", SIGINT);
    ck_assert_msg(strstr(out, want) && strstr(out, "w: SIGINT — stopping after this step"),
                  "the same kill twice was not one request:\n%s", out);
    ck_assert_msg(st == 128 + SIGINT && !strstr(out, "still running"),
                  "status %d: a kill from another process did not stop it at once:\n%s", st, out);
    free(out);
    gap = 1.1; /* past the second in which a repeat is the same request */
    st = test_run_captured(kill_self_twice_child, &gap, &out);
    ck_assert_msg(st == 128 + SIGINT && !strstr(out, "after two kills"),
                  "status %d: the same process's kill 1.1 s later did not stop it at once:\n%s", st, out);
    free(out);
}
END_TEST

/* A failure elsewhere during a checkpoint write (stop.c, stop.h): the launcher's SIGTERM, with the abort
 * mark on the page, waits for the write; a second one does not — it stops the worker at once. */
static void deferred_then_second_child(void *arg) {
    (void)arg;
    StatusSlot *page = attach_one_slot_page();
    stop_install("w", "stopping after this step");
    __atomic_store_n(&page[0].abort, 1, __ATOMIC_SEQ_CST); /* as launch.c's stop_all */
    stop_save_begin();
    raise(SIGTERM);
    fprintf(stderr, "deferred while saving\n");
    raise(SIGTERM);
    fprintf(stderr, "still saving after a second SIGTERM\n");
    stop_save_end();
}

START_TEST(a_second_signal_during_a_deferred_save_stops_at_once) {
    char *out = NULL;
    int st = test_run_captured(deferred_then_second_child, NULL, &out);
    ck_assert_msg(st == 128 + SIGTERM && strstr(out, "deferred while saving\n") && !strstr(out, "still saving"),
                  "status %d (expected death by SIGTERM at the second signal):\n%s", st, out);
    free(out);
}
END_TEST

/* STAGE3_SAVE_DELAY_MS (test-only, beside STAGE3_FAIL_AT): 0 to 600000 ms, the most a test may hold a
 * checkpoint write open; one more is refused, as a value it cannot read is. */
static void save_delay_child(void *arg) {
    setenv("STAGE3_SAVE_DELAY_MS", arg, 1);
    unsetenv("STAGE3_FAIL_AT");
    status_attach(-1, 0, 0);
    printf("accepted\n");
}

static void hook_exits_7(void) {
    fflush(stdout);
    _exit(7);
}

static void die_collateral_child(void *arg) {
    die_user_hook = hook_exits_7;
    die_collateral(0, *(int *)arg, "a refusal");
}

/* die_collateral with code 2 is die_user's: the fuzzers' and in-process tests' hook (errors.h's
 * die_user_hook) runs first, as die_user's does; with code 1 (die_runtime's) it does not. */
START_TEST(save_delay_bounds_and_die_collateral_hook) {
    struct { const char *ms; int status; } cases[] = {{"600000", 0}, {"600001", 2}, {"-1", 2}, {"1x", 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        int st = test_run_captured(save_delay_child, (void *)cases[i].ms, &out);
        ck_assert_msg(st == cases[i].status && (st ? strstr(out, "expected milliseconds, 0 to 600000") != NULL
                                                   : strstr(out, "accepted") != NULL),
                      "STAGE3_SAVE_DELAY_MS=%s: status %d, expected %d:\n%s", cases[i].ms, st, cases[i].status, out);
        free(out);
    }
    int codes[] = {2, 1}, want[] = {7, 1};
    for (int i = 0; i < 2; i++) {
        char *out = NULL;
        int st = test_run_captured(die_collateral_child, &codes[i], &out);
        ck_assert_msg(st == want[i], "die_collateral(0, %d, …): status %d, expected %d:\n%s", codes[i], st, want[i], out);
        free(out);
    }
}
END_TEST

/* The same binary as a worker under torchrun's and srun's variables (started here by hand, as
 * those launchers would): it trains exactly as under our own launcher. torchrun's agent holds
 * MASTER_PORT itself, so a listener sits there to prove we use the port after it. */
START_TEST(workers_under_torchrun_and_srun_variables) {
    char dir[] = "/tmp/dist_XXXXXX", cmd[4096], *out;
    ck_assert(mkdtemp(dir));
    const char *common = TINY " --steps 4 --log-every 1 --deterministic --rdzv-timeout 20";
    int port = test_free_port();
    snprintf(cmd, sizeof cmd, "--nproc-per-node 2 --master-port %d %s --report %s/ours.jsonl", port, common, dir);
    ck_assert_msg(stage3(NULL, cmd, &out) == 0, "%s", out);
    free(out);

    port = test_free_port();
    int agent = net_listen("127.0.0.1", port, NULL); /* stands for torchrun's agent store */
    ck_assert(agent >= 0);
    const char *tr = "WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 "
                     "TORCHELASTIC_RUN_ID=test TORCHELASTIC_USE_AGENT_STORE=True";
    snprintf(cmd, sizeof cmd,
             "(RANK=0 LOCAL_RANK=0 %s MASTER_PORT=%d " LIMIT "%s/stage3 %s --report %s/torchrun.jsonl & "
             "RANK=1 LOCAL_RANK=1 %s MASTER_PORT=%d " LIMIT "%s/stage3 %s; r1=$?; wait $!; r0=$?; exit $((r0 | r1)))",
             tr, port, test_root(), common, dir, tr, port, test_root(), common);
    int rc = test_run(cmd, &out);
    close(agent);
    ck_assert_msg(rc == 0, "torchrun-style workers failed (%d):\n%s", rc, out);
    free(out);

    port = test_free_port();
    snprintf(cmd, sizeof cmd,
             "(SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2 MASTER_PORT=%d " LIMIT "%s/stage3 %s --report %s/srun.jsonl & "
             "SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_NTASKS=2 MASTER_PORT=%d " LIMIT "%s/stage3 %s; r1=$?; wait $!; r0=$?; "
             "exit $((r0 | r1)))",
             port, test_root(), common, dir, port, test_root(), common);
    ck_assert_msg(test_run(cmd, &out) == 0, "srun-style workers failed:\n%s", out);
    free(out);

    double a[8], b[8], c[8];
    char p[600];
    snprintf(p, sizeof p, "%s/ours.jsonl", dir);
    ck_assert_int_eq(test_read_losses(p, a, 8), 4);
    snprintf(p, sizeof p, "%s/torchrun.jsonl", dir);
    ck_assert_int_eq(test_read_losses(p, b, 8), 4);
    snprintf(p, sizeof p, "%s/srun.jsonl", dir);
    ck_assert_int_eq(test_read_losses(p, c, 8), 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(a[i] == b[i], "step %d: launcher %.9g, torchrun-style %.9g", i + 1, a[i], b[i]);
        ck_assert_msg(a[i] == c[i], "step %d: launcher %.9g, srun-style %.9g", i + 1, a[i], c[i]);
    }
}
END_TEST

/* Two launchers as on two machines (--nnodes 2), node 0 running BIN0 ARGS0 and node 1 BIN1 ARGS1, on
 * one free port; OUT ends with "exit codes R0 R1". */
static void run_two_nodes(const char *bin0, const char *args0, const char *bin1, const char *args1, char **out) {
    int port = test_free_port();
    char cmd[4096], path0[1024], path1[1024]; /* a stage's name, or a binary's absolute path */
    snprintf(path0, sizeof path0, "%s%s%s", bin0[0] == '/' ? "" : test_root(), bin0[0] == '/' ? "" : "/", bin0);
    snprintf(path1, sizeof path1, "%s%s%s", bin1[0] == '/' ? "" : test_root(), bin1[0] == '/' ? "" : "/", bin1);
    snprintf(cmd, sizeof cmd,
             "(" LIMIT "%s " TINY " --nnodes 2 --node-rank 0 --master-port %d %s & " LIMIT "%s " TINY
             " --nnodes 2 --node-rank 1 --master-port %d %s; r1=$?; wait $!; r0=$?; echo \"exit codes $r0 $r1\")",
             path0, port, args0, path1, port, args1);
    ck_assert_int_eq(test_run(cmd, out), 0);
}

/* --nnodes 2: two launchers (as on two machines), one worker each; they must agree on the flags —
 * every flag that changes what is trained or which collectives run, each named when it differs (a
 * different --grad-comm once garbled the bucket plan and crashed stage 5). Paths and the like may
 * differ (--workers and the like here). */
START_TEST(two_nodes_and_mismatched_flags) {
    static const struct { const char *stage, *flag, *named; } cases[] = {
        {"stage3", "", NULL},
        {"stage3", "--workers 2 --pin-memory --comm-timeout 100", NULL},
        /* the list of flags free to differ is the table's (--nproc-per-node and --nnodes are) */
        {"stage3", "--log-every 1", "different --log-every — start every rank with the same flags (only --data, "},
        {"stage3", "--lr 0.05", "different --lr "},
        {"stage3", "--no-shuffle", "different --no-shuffle "},
        {"stage5", "--grad-comm fp16", "different --grad-comm "},
        {"stage5", "--amp bf16", "different --amp "},
        /* rank 0's loss gradient is the one made inf: given to node 1 alone it injected nothing, and said
         * nothing (rank 1 prints no notes) — the step was not skipped (from the cross-rank audit) */
        {"stage5", "--test-inf-step 2", "different --test-inf-step "},
        /* the default 25 typed: the same value, but a given cap caps the rebuilt first bucket too, so
         * the two ranks would all-reduce different buckets */
        {"stage3", "--bucket-mb 25", "different training flags"},
    };
    char args[256], *out;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        snprintf(args, sizeof args, "--steps 3 --nproc-per-node 1 %s", cases[k].flag);
        run_two_nodes(cases[k].stage, "--steps 3 --nproc-per-node 1", cases[k].stage, args, &out);
        if (cases[k].named) {
            ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, cases[k].named), "%s %s:\n%s", cases[k].stage,
                          cases[k].flag, out);
            if (strstr(cases[k].named, "(only"))
                ck_assert_msg(strstr(out, ", --nproc-per-node, --nnodes; --trace only in its value may differ)"), "%s",
                              out);
        } else {
            ck_assert_msg(strstr(out, "exit codes 0 0") && strstr(out, "summary:"), "%s %s:\n%s", cases[k].stage,
                          cases[k].flag, out);
        }
        free(out);
    }
    /* the job's shape is compared as it resolves: --nproc-per-node 2 on one node, the CPU default (2)
     * on the other, is one job (it used to be refused as different flags) */
    run_two_nodes("stage3", "--steps 2 --nproc-per-node 2", "stage3", "--steps 2", &out);
    ck_assert_msg(strstr(out, "exit codes 0 0") && strstr(out, "summary:"), "%s", out);
    free(out);
    /* --trace may be spelled differently, but rank 0 merges every rank's NAME.rankN.json from its own
     * path: node 1 tracing to another file trained to the end, then failed the merge ("rank 1's file … is
     * missing"). Refused before training now (from the cross-rank audit); the same file is fine. */
    char *dir = test_tmpdir(), a0[1024], a1[1024];
    snprintf(a0, sizeof a0, "--steps 2 --nproc-per-node 1 --trace %s/t.json", dir);
    snprintf(a1, sizeof a1, "--steps 2 --nproc-per-node 1 --trace %s/u.json", dir);
    run_two_nodes("stage3", a0, "stage3", a1, &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "rank 0 cannot see rank 1's timeline") &&
                      !strstr(out, "summary:"), "%s", out);
    free(out);
    snprintf(a1, sizeof a1, "--steps 2 --nproc-per-node 1 --trace %s/./t.json", dir);
    run_two_nodes("stage3", a0, "stage3", a1, &out);
    ck_assert_msg(strstr(out, "exit codes 0 0") && strstr(out, "from 2 ranks merged into"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* A second node 0 (a launcher not given its --node-rank, whose default is 0) found the port taken and
 * was told to pick a free one; it is told that node 0 runs already and to give its --node-rank. Two
 * workers of an external launcher given RANK=0 are told the same way. */
/* ENV0 stage3 TINY ARGS0 in the background, then a second later ENV1 stage3 TINY ARGS1, both on one free
 * port as the rendezvous; OUT holds the second's output and "second exit N". */
static void run_second_after(const char *env0, const char *args0, const char *env1, const char *args1, char **out) {
    char cmd[4096];
    int port = test_free_port();
    snprintf(cmd, sizeof cmd,
             "(MASTER_PORT=%d %s " LIMIT "%s/stage3 " TINY " --master-port %d %s > /dev/null 2>&1 & sleep 1; "
             "MASTER_PORT=%d %s " LIMIT "%s/stage3 " TINY " --master-port %d %s; echo \"second exit $?\"; wait)",
             port, env0, test_root(), port, args0, port, env1, test_root(), port, args1);
    ck_assert_int_eq(test_run(cmd, out), 0);
}

START_TEST(a_second_rank_0_is_named) {
    char *out;
    run_second_after("", "--nnodes 2 --node-rank 0 --nproc-per-node 1 --rdzv-timeout 5", "",
                     "--nnodes 2 --nproc-per-node 1", &out);
    ck_assert_msg(strstr(out, "second exit 2") && strstr(out, "node 0 of this job is already running") &&
                  strstr(out, "give this node its own --node-rank (1; the default is 0)") &&
                  strstr(out, "if that is another job of yours with the same secret, pick a free --master-port"),
                  "%s", out);
    free(out);
    const char *torchrun = "TORCHELASTIC_RUN_ID=x WORLD_SIZE=2 RANK=0";
    run_second_after(torchrun, "--rdzv-timeout 5", torchrun, "", &out);
    ck_assert_msg(strstr(out, "second exit 2") && strstr(out, "another process of this job is rank 0 already"), "%s",
                  out);
    free(out);
    /* under another launcher its variables set the world size: the message names WORLD_SIZE, not our
     * flags (it said "start every node with the same --nnodes and --nproc-per-node") */
    run_second_after(torchrun, "--rdzv-timeout 20", "TORCHELASTIC_RUN_ID=x RANK=1 WORLD_SIZE=3", "", &out);
    ck_assert_msg(strstr(out, "second exit 2") && strstr(out, "every rank needs the same WORLD_SIZE (torchrun sets it)"),
                  "%s", out);
    free(out);
}
END_TEST

/* Two jobs of one node each, started from a shell that exported STAGE_RDZV_SECRET (as the multi-node
 * recipe does) on the same --master-port: they shared the secret, so the second launcher took the
 * first job's store for its own ("node 0 of this job is already running — give this node its own
 * --node-rank"), and, started at the same moment, one job's rank 1 claimed a rank in the other's
 * rendezvous and stopped both. A job of one node makes its own secret: the second is told that the
 * port is taken, and the first trains on. */
/* Two jobs of one node from one shell, both given ARGS: the second starts once the first is training
 * (its ddp: line). OUT holds the second's output and "second exit N", then "first still training" if
 * it was when the second ended, "first exit N" and the first's launch line. */
static void run_two_jobs(const char *args, char **out) {
    char *dir = test_tmpdir(), cmd[4096];
    /* The first trains until the second is done (1000 epochs), then is stopped with SIGTERM, which a
     * healthy launcher answers by stopping its workers and exiting 143 (128 + 15, as torchrun does): a
     * first job of 10 epochs could end before the second looked at its port. SIGTERM, not Ctrl-C's
     * SIGINT, which a shell without job control leaves ignored in what it starts with `&`. */
    snprintf(cmd, sizeof cmd,
             "(D=%s; " LIMIT "%s/stage3 " TINY " --nproc-per-node 2 --epochs 1000 %s > $D/first.txt 2>&1 & t=$!; "
             "for i in $(seq 1 2400); do grep -q '^ddp:' $D/first.txt 2>/dev/null && break; sleep 0.05; done; "
             LIMIT "%s/stage3 " TINY " --nproc-per-node 2 %s; echo \"second exit $?\"; "
             "read -r l _ < /proc/$t/task/$t/children; kill -0 $l && echo 'first still training'; kill -TERM $l; "
             "wait $t; echo \"first exit $?\"; grep -e '^stage3: launching' $D/first.txt)",
             dir, test_root(), args, test_root(), args);
    ck_assert_int_eq(test_run(cmd, out), 0);
    free(dir);
}

START_TEST(two_jobs_sharing_an_exported_secret_stay_apart) {
    ck_assert_str_eq(getenv("STAGE_RDZV_SECRET"), TEST_SECRET); /* exported to both, by the fixture */
    char *dir = test_tmpdir(), cmd[4096], want[96], *out;
    int port = test_free_port();
    snprintf(cmd, sizeof cmd, "--master-port %d", port);
    run_two_jobs(cmd, &out);
    snprintf(want, sizeof want, "--master-port %d on 127.0.0.1 is in use (another job", port);
    ck_assert_msg(strstr(out, "second exit 2") && strstr(out, want) && strstr(out, "pick a free one with --master-port") &&
                  !strstr(out, "node 0 of this job is already running") && strstr(out, "first still training\nfirst exit 143"), "%s", out);
    free(out);
    /* …so a secret it does not use does not stop it either: one too short, or a secret file others may read,
     * exported for jobs of several nodes, refused a job of one ("use at least 16", "chmod 600") */
    snprintf(cmd, sizeof cmd, "D=%s; echo a-secret-others-may-read > $D/s && chmod 644 $D/s && "
             "STAGE_RDZV_SECRET=short " LIMIT "%s/stage3 " TINY " --nproc-per-node 1 --steps 1 --master-port %d && "
             "env -u STAGE_RDZV_SECRET STAGE_RDZV_SECRET_FILE=$D/s " LIMIT "%s/stage3 " TINY " --nproc-per-node 1 "
             "--steps 1 --master-port %d", dir, test_root(), test_free_port(), test_root(), test_free_port());
    ck_assert_msg(test_run(cmd, &out) == 0, "%s", out);
    free(out), free(dir);
}
END_TEST

/* --standalone (torchrun's): two jobs of one node on one machine, neither given a port, each on a free
 * one the launcher picked — the second starts while the first is training, and both finish. A port is
 * then the launcher's to pick, so --master-port beside it, several nodes, or another launcher's worker
 * (whose MASTER_PORT is set) are refused. */
START_TEST(standalone_jobs_pick_ports_of_their_own) {
    char cmd[4096], *out;
    run_two_jobs("--standalone", &out);
    int ports[2] = {0, 0}, n = 0;
    for (const char *at = out; n < 2 && (at = strstr(at, "rendezvous at 127.0.0.1:")); at++)
        ports[n++] = atoi(at + strlen("rendezvous at 127.0.0.1:"));
    ck_assert_msg(n == 2 && ports[0] > 0 && ports[0] != ports[1] && strstr(out, "second exit 0") &&
                  strstr(out, "first still training\nfirst exit 143") && strstr(out, " (a free port: --standalone)"), "ports %d %d:\n%s",
                  ports[0], ports[1], out);
    free(out);
    static const struct {
        const char *env, *args, *want;
    } refused[] = {
        {"", "--standalone --master-port 29612", "--standalone picks a free port itself: drop --master-port 29612"},
        {"", "--standalone --nnodes 2", "--standalone is a job of one node"},
        /* a --master-addr it cannot listen on: said as such, not "no free TCP port on nosuchhost.invalid (No such
         * file or directory) — … or give --master-port instead", which would fail there too */
        {"", "--standalone --master-addr nosuchhost.invalid", "--master-addr nosuchhost.invalid is no host name"},
        {"", "--standalone --master-addr 192.0.2.1", "--master-addr 192.0.2.1 is not an address of this machine"},
        {"RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_PORT=29613 TORCHELASTIC_RUN_ID=t ",
         "--standalone", "torchrun started this worker and set its rendezvous port (MASTER_PORT=29613)"},
        /* the port as torchrun set it, not ours one above it next to its agent's store */
        {"RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_PORT=29613 TORCHELASTIC_RUN_ID=t "
         "TORCHELASTIC_USE_AGENT_STORE=True ",
         "--standalone", "torchrun started this worker and set its rendezvous port (MASTER_PORT=29613)"},
        /* mpirun sets no MASTER_PORT: its ranks meet at --master-port (it was said to be MASTER_PORT=29500) */
        {"MASTER_PORT= OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_LOCAL_RANK=0 "
         "OMPI_COMM_WORLD_LOCAL_SIZE=1 ",
         "--standalone", "mpirun started this worker, and its ranks meet at one agreed port (--master-port, 29500"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s" LIMIT "%s/stage3 " TINY " %s", refused[i].env, test_root(), refused[i].args);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 2 && strstr(out, refused[i].want), "%s: exit %d:\n%s", refused[i].args, rc, out);
        free(out);
    }
}
END_TEST

/* --standalone keeps the port it picked: the launcher listens on it and hands that socket to rank 0
 * (STAGE_STORE_FD), which serves the rendezvous store on it — closed in between, the port was free for
 * anyone until rank 0 bound it. Seen from /proc while the job trains: rank 0's environment names the
 * descriptor, which is the socket listening on the banner's port; rank 1 was given none. */
START_TEST(standalone_hands_its_listening_socket_to_rank_0) {
    char *dir = test_tmpdir(), cmd[4096], *out;
    snprintf(cmd, sizeof cmd,
             "D=%s; " LIMIT "%s/stage3 " TINY " --nproc-per-node 2 --epochs 1000 --standalone > $D/o.txt 2>&1 & t=$!; "
             "for i in $(seq 1 2400); do grep -q '^ddp:' $D/o.txt 2>/dev/null && break; sleep 0.05; done; "
             "read -r l _ < /proc/$t/task/$t/children; " /* timeout's child: the launcher */
             "hex=$(printf ':%%04X' $(sed -n 's/.*rendezvous at 127.0.0.1:\\([0-9]*\\).*/\\1/p' $D/o.txt)); "
             "for c in $(cat /proc/$l/task/$l/children); do "
             "  e=$(tr '\\0' '\\n' < /proc/$c/environ); r=$(echo \"$e\" | sed -n 's/^RANK=//p'); "
             "  fd=$(echo \"$e\" | sed -n 's/^STAGE_STORE_FD=//p'); "
             "  ino=$([ -n \"$fd\" ] && readlink /proc/$c/fd/$fd | sed -n 's/^socket:\\[\\([0-9]*\\)\\]$/\\1/p'); "
             "  n=$(awk -v p=\"$hex\" -v i=\"$ino\" '$2 ~ p\"$\" && $4 == \"0A\" && $10 == i' /proc/net/tcp /proc/net/tcp6 "
             "      | wc -l); "
             "  echo \"rank $r fd ${fd:-none} listening $n\"; "
             "done | sort; kill $l; wait; head -n 1 $D/o.txt",
             dir, test_root());
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "rank 0 fd ") && !strstr(out, "rank 0 fd none") && strstr(out, "listening 1\n") &&
                  strstr(out, "rank 1 fd none listening 0") && strstr(out, "(a free port: --standalone)"), "%s", out);
    free(out), free(dir);
}
END_TEST

/* --data is a node's own path, so it may differ — but not what it holds: CIFAR-10 on one node and the
 * synthetic set on the other, or a copy that differs in one label or one pixel, trained on silently (or, with sets
 * of other sizes, failed later blaming the other rank). Both stop at once, naming the data. */
START_TEST(nodes_reading_other_data_are_refused) {
    char *dir = test_tmpdir(), args[1024], *out;
    /* a: the set; b: one label differs; c: one pixel differs — image 9's second byte, 9 · 3072 + 1 of the
     * images, which is no multiple of 61 (a sample of every 61st byte let that copy train) */
    for (int copy = 0; copy < 3; copy++)
        for (int k = 0; k < CIFAR10_FILES; k++) {
            char path[700];
            snprintf(path, sizeof path, "%s/%c", dir, 'a' + copy);
            mkdir(path, 0700);
            snprintf(path, sizeof path, "%s/%c/%s", dir, 'a' + copy, cifar10_file_names[k]);
            FILE *f = fopen(path, "wb");
            ck_assert_ptr_nonnull(f);
            for (long b = 0; b < 3073L * 64; b++)
                fputc(copy == 1 && k == 0 && b == 3073L * 9 ? 7 : copy == 2 && k == 0 && b == 3073L * 9 + 2 ? 2
                      : b % 3073 ? 1 : 3, f);
            fclose(f);
        }
    snprintf(args, sizeof args, "--steps 2 --nproc-per-node 1 --data %s/a", dir);
    run_two_nodes("stage3", args, "stage3", args, &out); /* the same files: fine */
    ck_assert_msg(strstr(out, "exit codes 0 0"), "%s", out);
    free(out);
    run_two_nodes("stage3", args, "stage3", "--steps 2 --nproc-per-node 1", &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "the ranks read different data (this one: CIFAR-10 "
                  "(--data), 256 training and 64 test images)") && strstr(out, "synthetic data, 256 training"), "%s", out);
    free(out);
    char args1[1024];
    snprintf(args1, sizeof args1, "--steps 2 --nproc-per-node 1 --data %s/b", dir);
    run_two_nodes("stage3", args, "stage3", args1, &out); /* one label differs */
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "the ranks read different data"), "%s", out);
    free(out);
    snprintf(args1, sizeof args1, "--steps 2 --nproc-per-node 1 --data %s/c", dir);
    run_two_nodes("stage3", args, "stage3", args1, &out); /* one pixel differs (from the cross-rank audit) */
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "the ranks read different data"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* --resume given to one node only: its rank would continue at step 3 while the other starts at step 0
 * (a path may differ between the ranks, but not whether there is one). Both stop, saying so. --save
 * on node 0 alone is fine (rank 0 is the one that saves); on node 1 alone it would save nothing — and
 * so with --report. */
START_TEST(resume_on_one_node_only_is_refused) {
    char *dir = test_tmpdir(), args[1024], *out;
    snprintf(args, sizeof args, "--steps 3 --nproc-per-node 1 --save %s/n", dir);
    run_two_nodes("stage3", args, "stage3", "--steps 3 --nproc-per-node 1", &out);
    ck_assert_msg(strstr(out, "exit codes 0 0"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "--steps 5 --nproc-per-node 1 --resume %s/n/step00000003.ckpt", dir);
    run_two_nodes("stage3", args, "stage3", "--steps 5 --nproc-per-node 1", &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "--resume is given to 1 of the 2 ranks"), "%s", out);
    free(out);
    /* --save on node 1 alone: only rank 0 saves, so nothing would be — refused before training */
    snprintf(args, sizeof args, "--steps 3 --nproc-per-node 1 --save %s/n1", dir);
    run_two_nodes("stage3", "--steps 3 --nproc-per-node 1", "stage3", args, &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "--save is given to 1 of the 2 ranks, but not to rank 0"),
                  "%s", out);
    free(out);
    /* --report on node 1 alone: only rank 0 writes the report, so it was silently never written (from
     * the cross-rank audit) */
    snprintf(args, sizeof args, "--steps 3 --nproc-per-node 1 --report %s/r1.jsonl", dir);
    run_two_nodes("stage3", "--steps 3 --nproc-per-node 1", "stage3", args, &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "--report is given to 1 of the 2 ranks, but not to "
                  "rank 0"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* --save on node 0 alone (allowed: rank 0 is the one that saves), then a scheduler's SIGTERM to both
 * nodes: every rank stops at the same step and rank 0 saves it, as when every node has --save. Before,
 * only a rank given --save caught the signal: node 1's worker died of it at once, and rank 0, its peer
 * gone, failed unsaved (from the cross-rank audit). */
START_TEST(save_on_node_0_alone_still_stops_cleanly) {
    char *dir = test_tmpdir(), cmd[4096], *out;
    const int port = test_free_port();
    const char *s = TINY " --epochs 1000 --log-every 4 --nnodes 2 --nproc-per-node 1";
    snprintf(cmd, sizeof cmd,
             "D=%s; %s/stage3 %s --node-rank 0 --master-port %d --save $D/s > $D/n0.log 2>&1 & a=$!; "
             "%s/stage3 %s --node-rank 1 --master-port %d > $D/n1.log 2>&1 & b=$!; "
             "while ! grep -qs 'saved checkpoint' $D/n0.log && kill -0 $a 2>/dev/null; do sleep 0.01; done; "
             "kill -TERM $a $b; i=0; while { kill -0 $a || kill -0 $b; } 2>/dev/null && [ $i -lt %d ]; do "
             "sleep 0.1; i=$((i+1)); done; kill -9 $a $b 2>/dev/null; wait $a; r0=$?; wait $b; r1=$?; "
             "cat $D/n0.log $D/n1.log; echo \"exit codes $r0 $r1\"",
             dir, test_root(), s, port, test_root(), s, port, (int)(600 * test_time_scale()));
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "stopped early by SIGTERM (received by 2 of 2 ranks) after step ") &&
                      strstr(out, "exit codes 143 143") && !strstr(out, "error:"),
                  "--save on node 0 alone: a SIGTERM must stop both ranks at one step, saved:\n%s", out);
    const char *at = strstr(out, "continue with --resume ");
    char path[1024];
    ck_assert_msg(at && sscanf(at, "continue with --resume %1023s", path) == 1 && access(path, F_OK) == 0, "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* The same on real nodes (GPU only): node 0's worker on the GPU over NCCL, node 1's on the CPU over
 * the host ring. Both stop at once, naming the two kinds. */
START_TEST(gpu_and_cpu_nodes_are_refused) {
    if (!test_have_gpu("dist: a GPU node beside a CPU node")) return;
    char *out;
    double t0 = time_now();
    run_two_nodes("stage3", "--steps 2 --nproc-per-node 1 --device cuda", "stage3", "--steps 2 --nproc-per-node 1", &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "start every rank with the same --device and --comm"),
                  "%s", out);
    ck_assert_msg(time_now() - t0 < 60 * test_time_scale(), "took %.1f s:\n%s", time_now() - t0, out);
    free(out);
}
END_TEST

/* Two workers as srun starts them (no launcher of ours to stop the rest): rank 0 with ARGS0, rank 1
 * with ARGS1. OUT ends with "exit codes R0 R1". */
static void run_srun_pair(const char *args0, const char *args1, char **out) {
    int port = test_free_port();
    char cmd[4096];
    const char *env = "SLURM_STEP_ID=0 SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2";
    snprintf(cmd, sizeof cmd,
             "(%s SLURM_PROCID=0 SLURM_LOCALID=0 MASTER_PORT=%d " LIMIT "%s/stage3 " TINY " %s & %s SLURM_PROCID=1 "
             "SLURM_LOCALID=1 MASTER_PORT=%d " LIMIT "%s/stage3 " TINY " %s; r1=$?; wait $!; r0=$?; "
             "echo \"exit codes $r0 $r1\")",
             env, port, test_root(), args0, env, port, test_root(), args1);
    ck_assert_int_eq(test_run(cmd, out), 0);
}

/* Under srun a refused --resume stops rank 1 through the gate's sum (rank 0's last words), with one
 * line pointing at rank 0's error — over NCCL it used to wait --comm-timeout for a rank that had
 * left. Two ranks given checkpoints of different steps (a stale file on one node), or of the same
 * step of different runs, are refused; a copy of the same file is accepted. */
START_TEST(srun_ranks_agree_on_the_resume) {
    char *dir = test_tmpdir(), a0[1024], a1[1024], *out;
    snprintf(a0, sizeof a0, TINY " --epochs 2 --nproc-per-node 2 --master-port %d --save %s/s", test_free_port(), dir);
    ck_assert_int_eq(stage3(NULL, a0, &out), 0);
    free(out);
    /* a header alone: it passes every rank's up-front check (a file that is no checkpoint at all is
     * refused there, by each rank before the rendezvous), and rank 0's load refuses it */
    snprintf(a0, sizeof a0, "%s/bad", dir);
    test_write_ckpt_header_only(a0);
    snprintf(a0, sizeof a0, "--epochs 3 --comm-timeout 60 --resume %s/bad", dir);
    double t0 = time_now();
    run_srun_pair(a0, a0, &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "rank 1: rank 0 refused the --resume checkpoint") &&
                      strstr(out, "is truncated") && strstr(strstr(out, "is truncated") + 1, "is truncated") == NULL,
                  "%s", out);
    ck_assert_msg(time_now() - t0 < 30 * test_time_scale(), "took %.1f s:\n%s", time_now() - t0, out);
    free(out);
    snprintf(a0, sizeof a0, "--epochs 3 --comm-timeout 60 --resume %s/s/epoch001.ckpt", dir);
    snprintf(a1, sizeof a1, "--epochs 3 --comm-timeout 60 --resume %s/s/epoch002.ckpt", dir);
    run_srun_pair(a0, a1, &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "the ranks resumed at different steps"), "%s", out);
    free(out);
    /* the same step of another run (here --lr 0.05): each rank would start from its own weights */
    snprintf(a0, sizeof a0, TINY " --epochs 2 --lr 0.05 --nproc-per-node 2 --master-port %d --save %s/o",
             test_free_port(), dir);
    ck_assert_int_eq(stage3(NULL, a0, &out), 0);
    free(out);
    snprintf(a0, sizeof a0, "--epochs 3 --comm-timeout 60 --resume %s/s/epoch001.ckpt", dir);
    snprintf(a1, sizeof a1, "--epochs 3 --comm-timeout 60 --resume %s/o/epoch001.ckpt", dir);
    run_srun_pair(a0, a1, &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "the ranks resumed from different checkpoints"), "%s",
                  out);
    free(out);
    /* a copy of the same file (as on another node's disk) is the same checkpoint */
    snprintf(a1, sizeof a1, "cp %s/s/epoch001.ckpt %s/copy.ckpt", dir, dir);
    ck_assert_int_eq(system(a1), 0);
    snprintf(a1, sizeof a1, "--epochs 3 --comm-timeout 60 --resume %s/copy.ckpt", dir);
    run_srun_pair(a0, a1, &out);
    ck_assert_msg(strstr(out, "exit codes 0 0"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* Node 1 started with another --nproc-per-node than node 0: the ranks disagree on the world size.
 * Node 1's ranks see it at once; node 0's rank 0 must not wait --rdzv-timeout for a rank 1 that never
 * comes, but stop with the real cause, which node 1 left in the store. */
START_TEST(mismatched_world_size_stops_every_node_at_once) {
    char *out;
    double t0 = time_now();
    run_two_nodes("stage3", "--steps 3 --nproc-per-node 1 --rdzv-timeout 60", "stage3",
                  "--steps 3 --nproc-per-node 2 --rdzv-timeout 60", &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "rank 0: the rendezvous stopped: rank") &&
                      strstr(out, "start every node with the same --nnodes and --nproc-per-node"),
                  "%s", out);
    ck_assert_msg(time_now() - t0 < 30 * test_time_scale(), "took %.1f s (--rdzv-timeout 60):\n%s", time_now() - t0,
                  out);
    free(out);
}
END_TEST

/* The launcher names one rank as the first failure, in both its lines: when every rank refuses the
 * same error on its own (k < 3: usually no "stopping" line, none being left to stop), and
 * when one rank fails mid-run (k = 3: STAGE3_FAIL_AT) and the other notices and fails too, or is
 * stopped — whichever came first, the job's failure is rank 1's. */
START_TEST(launcher_names_one_first_failure) {
    for (int k = 0; k < 4; k++) {
        char *out, args[256];
        if (k < 3)
            snprintf(args, sizeof args, TINY " --steps 2 --nproc-per-node 2 --unused-param --master-port %d",
                     test_free_port()); /* every rank stops at step 2: DDP's unused-parameter error */
        else
            snprintf(args, sizeof args, TINY " --steps 6 --nproc-per-node 2 --master-port %d", test_free_port());
        ck_assert_int_eq(stage3(k < 3 ? NULL : "STAGE3_FAIL_AT=1:3", args, &out), k < 3 ? 2 : 3);
        if (k == 3)
            ck_assert_msg(strstr(out, "job failed: rank 1 (local rank 1") &&
                              strstr(out, "exited with code 3 at step 3 (first failure); 1 other worker "),
                          "%s", out);
        const char *failed = strstr(out, "job failed: rank "), *stopping = strstr(out, " — stopping the other");
        ck_assert_msg(failed, "%s", out);
        int r_failed = atoi(failed + strlen("job failed: rank ")), r_stopping = r_failed;
        if (stopping) { /* its line starts "stage3: rank N " */
            const char *line = stopping;
            while (line > out && line[-1] != '\n') line--;
            ck_assert_msg(sscanf(line, "stage3: rank %d ", &r_stopping) == 1, "%s", out);
        }
        ck_assert_msg(r_stopping == r_failed, "the launcher names rank %d, then rank %d:\n%s", r_stopping, r_failed,
                      out);
        free(out);
    }
}
END_TEST

/* Two ranks fail on their own, the first still inside its exit() (a GPU context's teardown takes
 * seconds; STAGE3_EXIT_DELAY_MS stands in for it) when the second dies: rank 1 exits with code 3 at
 * step 3, and rank 0, waiting in that step's all-reduce for it, is then killed from outside. The first
 * failure is rank 1's, and it is the one named. The launcher used to SIGTERM rank 1 mid-exit after its
 * 2 s wait, count it as one it had stopped, and blame rank 0's later SIGSEGV. */
START_TEST(launcher_names_the_first_failure_while_it_exits) {
    char *dir = test_tmpdir(), cmd[4096], *out;
    int seed = (int)(getpid() % 100000) * 10 + 9;
    snprintf(cmd, sizeof cmd,
             "D=%s; { STAGE3_FAIL_AT=1:3 STAGE3_EXIT_DELAY_MS=4000 " LIMIT "%s/stage3 " TINY " --steps 6 "
             "--nproc-per-node 2 --master-port %d --seed %d > $D/out.txt 2>&1; echo \"exit $?\" >> $D/out.txt; } & "
             "for i in $(seq 1 2400); do grep -q 'failing on purpose' $D/out.txt 2>/dev/null && break; sleep 0.05; done; "
             "sleep 0.3; " /* by then rank 1, whose line comes just before its exit(), is inside its 4 s */
             "for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline | grep -q -- '--seed %d ' || continue; "
             "tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx RANK=0 && kill -SEGV ${p#/proc/} && echo 'rank 0 killed'; done; "
             "wait; cat $D/out.txt",
             dir, test_root(), test_free_port(), seed, seed);
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "rank 0 killed\n"), "rank 0 was not killed meanwhile:\n%s", out);
    ck_assert_msg(strstr(out, "job failed: rank 1 (local rank 1") &&
                      strstr(out, "exited with code 3 at step 3 (first failure); 1 other worker failed too") &&
                      strstr(out, "exit 3\n"),
                  "rank 1 failed first, and is the one to name:\n%s", out);
    free(out), free(dir);
}
END_TEST

/* Two workers of `stage` as our launcher starts them (rank r with ARGS_r, both with ENV), beside the
 * status page it reads after a failure: rc[r] is rank r's exit code, and collateral[r] whether it
 * marked its failure as caused by another rank's. The launcher blames a non-collateral failure
 * first; these marks are what makes its choice the same every time, whichever rank exits first. */
static void run_marked_pair(const char *stage, const char *env, const char *args0, const char *args1, int rc[2],
                            int collateral[2], char **out) {
    int fd;
    StatusSlot *slots = status_page_create(2, &fd);
    const char *job = "WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1";
    int port = test_free_port();
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "(%s RANK=0 LOCAL_RANK=0 %s MASTER_PORT=%d STAGE3_STATUS_FD=%d " LIMIT "%s/%s " TINY " %s & "
             "%s RANK=1 LOCAL_RANK=1 %s MASTER_PORT=%d STAGE3_STATUS_FD=%d " LIMIT "%s/%s " TINY " %s; r1=$?; "
             "wait $!; r0=$?; echo \"exit codes $r0 $r1\")",
             env, job, port, fd, test_root(), stage, args0, env, job, port, fd, test_root(), stage, args1);
    ck_assert_int_eq(test_run(cmd, out), 0);
    const char *codes = strstr(*out, "exit codes ");
    ck_assert_msg(codes && sscanf(codes, "exit codes %d %d", &rc[0], &rc[1]) == 2, "%s", *out);
    for (int r = 0; r < 2; r++) collateral[r] = (int)__atomic_load_n(&slots[r].collateral, __ATOMIC_RELAXED);
    munmap(slots, 2 * sizeof *slots);
    close(fd);
}

/* A rank that exits because of another rank — rank 0's refusal of the --resume, a peer gone, or a
 * disagreement every rank finds at once, which is reported as rank 0's — marks its failure collateral,
 * so the launcher names the rank that caused it. Rank 1 used to be blamed for rank 0's refusal about
 * half the time on a busy machine ("job failed: rank 1 … (first failure)"), whichever exited first. */
START_TEST(failures_caused_by_a_peer_are_marked_collateral) {
    char *dir = test_tmpdir(), cmd[2048], a0[1024], a1[1024], *out;
    /* each stops inside its second epoch (2 and 16 steps an epoch): a checkpoint there means its samples, so
     * another batch or world size is refused (at an epoch's end both may change: test_resume.c) */
    snprintf(cmd, sizeof cmd, LIMIT "%s/stage4 " TINY " --batch-size 32 --accum-steps 2 --epochs 2 --steps 3 "
             "--nproc-per-node 2 --master-port %d --save %s/b32 && " LIMIT "%s/stage1 " TINY " --epochs 2 --steps 20 --save %s/one",
             test_root(), test_free_port(), dir, test_root(), dir);
    ck_assert_msg(test_run(cmd, &out) == 0, "%s", out);
    free(out);
    /* in each case rank 0's failure is the job's, rank 1's a consequence */
    static const struct { const char *what, *env, *args0, *args1, *said; } cases[] = {
        /* rank 0 refuses the file (another batch size, another world size); rank 1 learns it from the gate */
        {"refused --batch-size", "", "--batch-size 64 --accum-steps 2 --epochs 2 --resume %s/b32/step00000003.ckpt",
         "--batch-size 64 --accum-steps 2 --epochs 2 --resume %s/b32/step00000003.ckpt", "rank 1: rank 0 refused"},
        {"refused world size", "", "--epochs 2 --resume %s/one/step00000020.ckpt",
         "--epochs 2 --resume %s/one/step00000020.ckpt", "rank 1: rank 0 refused"},
        /* found by both at once: reported as rank 0's */
        {"--resume on rank 0 only", "", "--epochs 2 --resume %s/b32/epoch001.ckpt --batch-size 32",
         "--epochs 2 --batch-size 32", "--resume is given to 1 of the 2 ranks"},
        {"different --lr", "", "--steps 2", "--steps 2 --lr 0.05", "started with different --lr"},
        /* rank 0 fails at step 2; rank 1 loses its ring neighbour */
        {"rank 0 gone", "STAGE3_FAIL_AT=0:2", "--steps 4", "--steps 4", "it probably failed"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int rc[2], coll[2];
        snprintf(a0, sizeof a0, cases[k].args0, dir);
        snprintf(a1, sizeof a1, cases[k].args1, dir);
        run_marked_pair("stage4", cases[k].env, a0, a1, rc, coll, &out);
        ck_assert_msg(rc[0] && rc[1] && strstr(out, cases[k].said), "%s:\n%s", cases[k].what, out);
        ck_assert_msg(coll[0] == 0 && coll[1] == 1, "%s: collateral marks %d %d, expected 0 1:\n%s", cases[k].what,
                      coll[0], coll[1], out);
        free(out);
    }
    /* and through the launcher itself, as it was seen: the job's failure is rank 0's refusal */
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, LIMIT "%s/stage4 " TINY " --batch-size 64 --accum-steps 2 --epochs 2 "
                 "--nproc-per-node 2 --master-port %d --resume %s/b32/step00000003.ckpt", test_root(), test_free_port(),
                 dir);
        ck_assert_int_eq(test_run(cmd, &out), 2);
        ck_assert_msg(strstr(out, "job failed: rank 0 (local rank 0"), "%s", out);
        free(out);
    }
    free(dir);
}
END_TEST

/* Exactly one process may hold each rank: a second process claiming a rank already claimed is
 * refused at once, by name (not left to time out waiting for the rank that was never started). */
static void open_rank1_of3(void *p) {
    store_open("127.0.0.1", *(int *)p, 1, 3, 5);
    printf("rank 1 joined twice\n");
}

START_TEST(a_rank_claimed_twice_is_refused) {
    int port = test_free_port();
    pid_t host = fork(); /* rank 0 of 3, hosting the store; it stops when the rendezvous is aborted */
    ck_assert_int_ge(host, 0);
    if (host == 0) {
        close(1), close(2);
        store_open("127.0.0.1", port, 0, 3, 5);
        _exit(0);
    }
    /* the first rank 1: its claim, as store_open makes it (ADD rdzv/claim/1 1) */
    const char *why = "";
    int fd = store_dial("127.0.0.1", port, (const uint8_t *)TEST_SECRET, strlen(TEST_SECRET), 10, &why);
    ck_assert_msg(fd >= 0, "%s", why);
    uint8_t req[12 + 12 + 8] = {3}, rep[16];
    uint32_t klen = htonl(12), vlen = htonl(8);
    memcpy(req + 4, &klen, 4), memcpy(req + 8, &vlen, 4), memcpy(req + 12, "rdzv/claim/1", 12);
    req[sizeof req - 1] = 1;
    ck_assert_int_eq(net_send_all(fd, req, sizeof req, 5), 0);
    ck_assert_int_eq(net_recv_all(fd, rep, sizeof rep, 5), 0);
    ck_assert_msg(rep[0] == 1 && rep[15] == 1, "the first claim of rank 1 was not counted 1");
    /* the second rank 1 */
    char *out;
    ck_assert_int_eq(test_run_captured(open_rank1_of3, &port, &out), 2);
    ck_assert_msg(strstr(out, "two processes claim rank 1 of 3") && !strstr(out, "joined twice"), "%s", out);
    free(out);
    close(fd);
    waitpid(host, NULL, 0);
}
END_TEST

/* Two nodes of two workers each: node 1's launcher numbers its workers 2 and 3 (node_rank ×
 * nproc-per-node onwards), so the four ranks are distinct and the job trains. */
START_TEST(two_nodes_of_two_workers) {
    char *out;
    run_two_nodes("stage3", "--steps 2 --nproc-per-node 2", "stage3", "--steps 2 --nproc-per-node 2", &out);
    ck_assert_msg(strstr(out, "exit codes 0 0") && strstr(out, "(ranks 0-1 of 4,") && strstr(out, "(ranks 2-3 of 4,") &&
                      strstr(out, "summary:"), "%s", out);
    free(out);
}
END_TEST

/* A worker's GPU is its local rank modulo the GPUs visible on its node — not its global rank, which
 * differs when a node's workers are not a multiple of its GPUs (node 1's first worker of three is
 * rank 3, and takes GPU 0). */
START_TEST(worker_gpu_follows_its_local_rank) {
    Worker w = {.rank = 3, .local_rank = 0, .world_size = 6, .local_world_size = 3, .node_rank = 1};
    ck_assert_int_eq(launch_gpu_of(&w, 2), 0);
    w.rank = 5, w.local_rank = 2;
    ck_assert_int_eq(launch_gpu_of(&w, 2), 0);
    ck_assert_int_eq(launch_gpu_of(&w, 4), 2);
    ck_assert_int_eq(launch_gpu_of(&w, 0), 0); /* no GPU: the CPU */
}
END_TEST

/* The GPUs a node's workers have: under srun or mpirun one visible GPU is each task's own, so 4 tasks
 * with one each have 4 and share none — rank 0 used to print "4 workers share 1 GPU(s) through --comm
 * host" there, for a job that ran NCCL on 4 GPUs. Under our launcher or torchrun every worker sees the
 * node's GPUs, and more workers than GPUs share them. */
START_TEST(node_gpus_count_each_tasks_own) {
    ck_assert_int_eq(launch_node_gpus("srun", 1, 4), 4);
    ck_assert_int_eq(launch_node_gpus("mpirun", 1, 2), 2);
    ck_assert_int_eq(launch_node_gpus("srun", 2, 4), 2); /* two visible: the node's, shared */
    ck_assert_int_eq(launch_node_gpus("stage3", 1, 2), 1);
    ck_assert_int_eq(launch_node_gpus("torchrun", 1, 2), 1);
    ck_assert_int_eq(launch_node_gpus("environment", 2, 2), 2);
}
END_TEST

/* A barrier lets no rank through before every rank has reached it: rank 0 waits in one while rank 1
 * watches for the mark rank 0 sets right after it, for half a second, and only then arrives. */
static double second_barrier_s; /* how long rank 0 waited in its second barrier */
static void *barrier_rank0(void *p) {
    RankArg *a = p;
    Store *s = store_open("127.0.0.1", a->port, 0, 2, 20);
    store_barrier(s, "the test's barrier");
    store_set(s, "rank 0 passed", "", 0);
    double t0 = time_now();
    store_barrier(s, "before closing");
    second_barrier_s = time_now() - t0;
    store_close(s);
    a->ok = 1;
    return NULL;
}

START_TEST(barrier_waits_for_every_rank) {
    RankArg a = {.port = test_free_port()};
    pthread_t t;
    pthread_create(&t, NULL, barrier_rank0, &a);
    Store *s = store_open("127.0.0.1", a.port, 1, 2, 20);
    while (store_add(s, "barrier/0", 0) < 1) usleep(1000); /* rank 0 is in the barrier */
    int early = 0;
    for (double t0 = time_now(); time_now() - t0 < 0.5 && !early;) {
        early = store_check(s, "rank 0 passed");
        usleep(2000);
    }
    store_barrier(s, "the test's barrier");
    store_wait(s, "rank 0 passed");
    usleep(500000); /* a second barrier waits too: each has its own count, none passes on the first's */
    store_barrier(s, "before closing");
    store_close(s);
    pthread_join(t, NULL);
    ck_assert_msg(!early, "rank 0 passed the barrier before rank 1 reached it");
    ck_assert_msg(second_barrier_s >= 0.4, "rank 0 passed its second barrier in %.3f s, before rank 1 (0.5 s late) "
                  "reached it", second_barrier_s);
    ck_assert(a.ok);
}
END_TEST

/* A MASTER_ADDR that srun's job script or torchrun exported wins over --master-addr (which is refused
 * when it differs), yet its errors said "check --master-addr", and its form was not checked: written
 * with its port, rank 1 waited out --rdzv-timeout to report a name that "did not resolve". Each now
 * names MASTER_ADDR and who set it, the form at once. */
START_TEST(an_exported_master_addr_is_named) {
    char env[512], args[256], *out;
    int port = test_free_port();
    snprintf(args, sizeof args, TINY " --steps 1 --rdzv-timeout 5");
    const struct { const char *launcher, *addr, *says, *by; } cases[] = {
        {"SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_NODEID=1 SLURM_NTASKS=2 SLURM_TASKS_PER_NODE='1(x2)'",
         "127.0.0.1:%d", "MASTER_ADDR '127.0.0.1:%d' carries a port: give them apart, MASTER_ADDR=127.0.0.1 "
         "MASTER_PORT=%d", "exported to every rank by your job script"},
        {"RANK=0 WORLD_SIZE=1 TORCHELASTIC_RUN_ID=t", "[::1]", "(MASTER_ADDR=::1)", "torchrun sets it"},
        {"RANK=0 WORLD_SIZE=1 TORCHELASTIC_RUN_ID=t", "nosuchhost.invalid",
         "no such host name (it does not resolve) — check MASTER_ADDR (", "torchrun sets it"},
        {"SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_NODEID=1 SLURM_NTASKS=2 SLURM_TASKS_PER_NODE='1(x2)'",
         "nosuchhost.invalid", "did not resolve within 5 s) — check MASTER_ADDR (", "your job script"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char addr[64], says[256];
        snprintf(addr, sizeof addr, cases[i].addr, port);
        snprintf(says, sizeof says, cases[i].says, port, port);
        snprintf(env, sizeof env, "%s MASTER_PORT=%d MASTER_ADDR=%s", cases[i].launcher, port, addr);
        double t0 = time_now();
        int rc = stage3(env, args, &out);
        double took = time_now() - t0;
        ck_assert_msg(rc == 2 && strstr(out, says) && strstr(out, cases[i].by) && !strstr(out, "check --master-addr") &&
                          !strstr(out, "apart, --master-addr"),
                      "%s: exit %d, expected 2 naming '%s' and '%s':\n%s", env, rc, says, cases[i].by, out);
        /* the form is refused at once; a name that does not resolve is known only after the timeout */
        ck_assert_msg(strstr(out, "resolve") || took < 4 * test_time_scale(), "%s: took %.1f s:\n%s", env, took, out);
        free(out);
    }
}
END_TEST

/* A rank that never arrives, or a store that cannot be reached, in a job of srun's or torchrun's: the
 * errors said "check --master-port" and "--nnodes, --node-rank" — flags that the launcher's exported
 * MASTER_PORT overrides (and that are refused when they differ). They now name the variables and who
 * set them. */
START_TEST(a_missing_rank_names_the_launchers_variables) {
    static const struct { const char *env, *says; } cases[] = {
        {"SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_NTASKS=2 MASTER_ADDR=127.0.0.1",
         "within 2 s (Connection refused) — check MASTER_ADDR and MASTER_PORT (exported to every rank by your job "
         "script), and that rank 0"},
        {"RANK=0 WORLD_SIZE=2 TORCHELASTIC_RUN_ID=t MASTER_ADDR=127.0.0.1",
         "rank 1 did not join within 2 s — check MASTER_ADDR and MASTER_PORT (torchrun sets them from its own "
         "--master-addr and --master-port) on its node"},
        {"SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2",
         "rank 1 did not join within 2 s — check --master-addr and MASTER_PORT (exported to every rank by your job "
         "script) on its node"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char env[512], *out;
        snprintf(env, sizeof env, "%s MASTER_PORT=%d", cases[i].env, test_free_port());
        int rc = stage3(env, TINY " --steps 1 --rdzv-timeout 2", &out);
        ck_assert_msg(rc == 2 && strstr(out, cases[i].says) && !strstr(out, "--nnodes"),
                      "%s: exit %d, expected 2 naming '%s':\n%s", env, rc, cases[i].says, out);
        free(out);
    }
}
END_TEST

/* A launcher's variables that cannot describe this job are refused before anything starts: a rank
 * equal to the world size, and a world that --nnodes × --nproc-per-node contradicts. */
START_TEST(worker_variables_out_of_range_are_refused) {
    static const struct { const char *env, *args, *says; } cases[] = {
        {"RANK=2 WORLD_SIZE=2", "", "rank 2 of a world of 2: RANK must be below WORLD_SIZE"},
        {"RANK=0 WORLD_SIZE=0", "", "WORLD_SIZE=0: the world size must be at least 1"},
        {"SLURM_STEP_ID=0 SLURM_PROCID=3 SLURM_LOCALID=0 SLURM_NTASKS=3", "", "rank 3 of a world of 3"},
        {"SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2 SLURM_TASKS_PER_NODE=2x", "",
         "SLURM_TASKS_PER_NODE='2x' is not a tasks-per-node list"},
        {"SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=11 SLURM_NODEID=3 SLURM_TASKS_PER_NODE='4(x2),3'", "",
         "lists 3 nodes, but this is node 3"},
        {"RANK=0 WORLD_SIZE=3 LOCAL_WORLD_SIZE=1", "--nnodes 2 --nproc-per-node 1", "the job has 3 workers"},
        /* more ranks than the store serves: the 4097th was refused with "did not send the store's greeting",
         * and 2^31-1 hung after the timeout, naming the missing ranks one request at a time */
        {"RANK=0 WORLD_SIZE=4097", "", "WORLD_SIZE=4097: a job has at most 4096 ranks"},
        {"RANK=0 WORLD_SIZE=2147483647", "", "a job has at most 4096 ranks"},
        {"OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=5000", "", "OMPI_COMM_WORLD_SIZE=5000: a job has at most"},
        /* past an int: said to be "not a non-negative integer", which it is, with no fix */
        {"RANK=0 WORLD_SIZE=99999999999", "", "WORLD_SIZE='99999999999' is not an integer from 0 to 2147483647"},
        {"RANK=x WORLD_SIZE=2", "", "RANK='x' is not an integer from 0 to 2147483647 — a launcher"},
        /* a local rank out of range named neither its variable nor the one it must stay below — nor,
         * for a LOCAL_RANK left unset, that it was RANK */
        {"RANK=3 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2", "",
         "local rank 3 of 2 workers per node is out of range: LOCAL_RANK (unset: RANK) must be below LOCAL_WORLD_SIZE"},
        {"SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_LOCALID=2 SLURM_NODEID=1 SLURM_NTASKS=4 SLURM_TASKS_PER_NODE='2(x2)'", "",
         "SLURM_LOCALID must be below SLURM_TASKS_PER_NODE's count for node 1"},
        {"OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=2 OMPI_COMM_WORLD_LOCAL_SIZE=2", "",
         "OMPI_COMM_WORLD_LOCAL_RANK must be below OMPI_COMM_WORLD_LOCAL_SIZE"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[512], *out;
        snprintf(args, sizeof args, TINY " --steps 1 --rdzv-timeout 2 --master-port %d %s", test_free_port(),
                 cases[i].args);
        int rc = stage3(cases[i].env, args, &out);
        ck_assert_msg(rc == 2 && strstr(out, cases[i].says), "%s %s: exit %d, expected 2 naming '%s':\n%s",
                      cases[i].env, cases[i].args, rc, cases[i].says, out);
        free(out);
    }
}
END_TEST

/* srun and mpirun often give each task its own GPU (CUDA_VISIBLE_DEVICES per task): one visible GPU
 * is then that worker's own, so NCCL is fine with several workers per node; under our own launcher
 * (or torchrun) one GPU for two workers is refused for NCCL. Logic only: no GPU is touched. */
static void resolve_nccl_one_gpu_two_workers(void *launcher) {
    LaunchConfig cfg = {.device = "cuda", .comm = "nccl"};
    int cuda;
    CommKind comm;
    launch_resolve(&cfg, launcher, 1, 2, &cuda, &comm);
    printf("cuda %d, %s\n", cuda, comm == COMM_NCCL ? "nccl" : "host");
}

START_TEST(per_task_gpu_under_srun_and_mpirun) {
    if (!comm_have_nccl()) return; /* built without NCCL: --comm nccl is refused for another reason */
    static const struct { const char *launcher; int rc; const char *says; } cases[] = {
        {"srun", 0, "cuda 1, nccl"},
        {"mpirun", 0, "cuda 1, nccl"},
        {"torchrun", 2, "need 2 GPUs"},
        {"stage3", 2, "need 2 GPUs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out;
        int rc = test_run_captured(resolve_nccl_one_gpu_two_workers, (void *)cases[i].launcher, &out);
        ck_assert_msg(rc == cases[i].rc && strstr(out, cases[i].says), "%s: exit %d, expected %d and '%s':\n%s",
                      cases[i].launcher, rc, cases[i].rc, cases[i].says, out);
        free(out);
    }
}
END_TEST

/* A worker's view of the job from each launcher's variables (launch_or_join in a child, which
 * prints it): the defaults torchrun documents (LOCAL_RANK = RANK, LOCAL_WORLD_SIZE = WORLD_SIZE when
 * unset), torchrun's agent store (our store one port up), srun's and mpirun's variables, and RANK
 * taking precedence over an allocation's SLURM_* (torchrun started inside srun). */
static void print_worker_view(void *env) {
    static const char *const vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                       "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                                       "TORCHELASTIC_USE_AGENT_STORE", "STAGE3_STATUS_FD", "SLURM_PROCID", "SLURM_STEP_ID",
                                       "SLURM_STEPID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
                                       "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE",
                                       "SLURM_TASKS_PER_NODE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", NULL};
    for (int i = 0; vars[i]; i++) unsetenv(vars[i]);
    char buf[512], *save, *kv;
    snprintf(buf, sizeof buf, "%s", (const char *)env);
    for (kv = strtok_r(buf, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(kv, '=');
        *eq = 0;
        setenv(kv, eq + 1, 1);
    }
    LaunchConfig cfg = {.nnodes = 1, .master_addr = "127.0.0.1", .master_port = 29500, .device = "cpu", .comm = "auto"};
    char *argv[] = {"stage3", NULL};
    Worker w;
    launch_or_join(1, argv, &cfg, &w);
    printf("rank %d local %d/%d world %d node %d port %d via %s\n", w.rank, w.local_rank, w.local_world_size,
           w.world_size, w.node_rank, w.master_port, w.launcher);
}

/* The worker that env's launcher variables make: its view line holds `view` (exit 0). */
static void expect_worker_view(const char *env, const char *view) {
    char *out;
    int rc = test_run_captured(print_worker_view, (void *)env, &out);
    ck_assert_msg(rc == 0 && strstr(out, view), "%s: exit %d, expected '%s':\n%s", env, rc, view, out);
    free(out);
}

/* …or no worker: refused (exit 2) with a message holding `says` and `also`, and never `never`. */
static void expect_worker_refused(const char *env, const char *says, const char *also, const char *never) {
    char *out;
    int rc = test_run_captured(print_worker_view, (void *)env, &out);
    ck_assert_msg(rc == 2 && strstr(out, says) && strstr(out, also) && !(never && strstr(out, never)),
                  "%s: exit %d, expected 2 naming '%s' and '%s':\n%s", env, rc, says, also, out);
    free(out);
}

START_TEST(worker_view_from_launcher_variables) {
    static const struct { const char *env, *view; } cases[] = {
        {"RANK=1 WORLD_SIZE=2", "rank 1 local 1/2 world 2 node 0 port 29500 via environment"},
        {"RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 MASTER_PORT=1234 TORCHELASTIC_RUN_ID=x "
         "TORCHELASTIC_USE_AGENT_STORE=True", "rank 3 local 1/2 world 4 node 1 port 1235 via torchrun"},
        {"SLURM_STEP_ID=0 SLURM_PROCID=5 SLURM_NTASKS=8 SLURM_LOCALID=1 SLURM_NODEID=1 SLURM_TASKS_PER_NODE=4(x2)",
         "rank 5 local 1/4 world 8 node 1 port 29500 via srun"},
        {"SLURM_STEPID=0 SLURM_PROCID=2 SLURM_NTASKS=3 SLURM_LOCALID=2", "rank 2 local 2/3 world 3 node 0 port 29500 via srun"},
        /* an irregular layout: node 2 holds the last 3 of 4 + 4 + 3 tasks */
        {"SLURM_STEP_ID=1 SLURM_PROCID=9 SLURM_STEP_NUM_TASKS=11 SLURM_LOCALID=1 SLURM_NODEID=2 "
         "SLURM_STEP_TASKS_PER_NODE=4(x2),3", "rank 9 local 1/3 world 11 node 2 port 29500 via srun"},
        /* srun -E keeps the allocation's counts: the step's own say what this step is */
        {"SLURM_STEP_ID=2 SLURM_PROCID=1 SLURM_NTASKS=8 SLURM_TASKS_PER_NODE=8 SLURM_STEP_NUM_TASKS=2 "
         "SLURM_STEP_TASKS_PER_NODE=2 SLURM_LOCALID=1", "rank 1 local 1/2 world 2 node 0 port 29500 via srun"},
        {"OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=6 OMPI_COMM_WORLD_LOCAL_RANK=2 OMPI_COMM_WORLD_LOCAL_SIZE=3",
         "rank 5 local 2/3 world 6 node 1 port 29500 via mpirun"},
        {"PMI_RANK=3 PMI_SIZE=4 MPI_LOCALRANKID=1 MPI_LOCALNRANKS=2", "rank 3 local 1/2 world 4 node 1 port 29500 via mpirun"},
        /* no local size given: the whole world is on this node, as for torchrun's LOCAL_WORLD_SIZE */
        {"OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1",
         "rank 1 local 1/2 world 2 node 0 port 29500 via mpirun"},
        {"PMI_RANK=1 PMI_SIZE=2", "rank 1 local 0/2 world 2 node 0 port 29500 via mpirun"},
        /* Slurm's PMI2 plugin sets PMI_RANK and PMI_SIZE in srun's tasks too: srun's variables decide */
        {"SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 PMI_RANK=1 PMI_SIZE=2",
         "rank 1 local 1/2 world 2 node 0 port 29500 via srun"},
        /* …but a Hydra mpirun in a Slurm allocation starts its proxies with srun, one task per node: the
         * step's variables are the proxies' (node 1 of 2), PMI's are the job's */
        {"SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=0 SLURM_NODEID=1 PMI_RANK=6 PMI_SIZE=8 "
         "MPI_LOCALRANKID=2 MPI_LOCALNRANKS=4", "rank 6 local 2/4 world 8 node 1 port 29500 via mpirun"},
        /* and so does Open MPI's, whose processes there carry its daemons' srun step */
        {"SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=0 SLURM_NODEID=1 OMPI_COMM_WORLD_RANK=5 "
         "OMPI_COMM_WORLD_SIZE=8 OMPI_COMM_WORLD_LOCAL_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=4",
         "rank 5 local 1/4 world 8 node 1 port 29500 via mpirun"},
        {"RANK=0 WORLD_SIZE=1 SLURM_PROCID=3 SLURM_NTASKS=4 SLURM_LOCALID=3",
         "rank 0 local 0/1 world 1 node 0 port 29500 via environment"},
        /* an sbatch script's export WORLD_SIZE=… beside srun's complete set: srun's, as before */
        {"SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=1 WORLD_SIZE=2",
         "rank 1 local 1/2 world 2 node 0 port 29500 via srun"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_worker_view(cases[i].env, cases[i].view);
}
END_TEST

/* torchrun numbers a node's workers in one block (RANK = the node's first rank + LOCAL_RANK, node
 * GROUP_RANK after GROUP_RANK nodes of a worker at least): variables that break it were accepted —
 * GROUP_RANK=1 in a one-node job trained as if node 0, and LOCAL_RANK above RANK or a block past
 * WORLD_SIZE started a worker that waited for a rank no one would start. Each is refused, naming the
 * variable to check; the layouts torchrun gives (two nodes of 2, nodes of 4 and 3), a hand-started
 * worker of node 1 without LOCAL_WORLD_SIZE, and srun's cyclic numbering still pass. */
START_TEST(torchrun_layouts_that_cannot_be_are_refused) {
    static const struct { const char *env, *says; } bad[] = {
        {"RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=1",
         "GROUP_RANK=1, but LOCAL_WORLD_SIZE = WORLD_SIZE = 1 makes this a job of one node, node 0"},
        {"RANK=1 WORLD_SIZE=2 GROUP_RANK=1", "first rank is 0 (RANK - LOCAL_RANK; an unset LOCAL_RANK is RANK)"},
        {"RANK=0 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2", "LOCAL_RANK=1 is above RANK=0"},
        {"RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2",
         "put this node's ranks at 1 … 2, past WORLD_SIZE=2 — check LOCAL_RANK and LOCAL_WORLD_SIZE"},
        {"RANK=2 WORLD_SIZE=4 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 GROUP_RANK=3",
         "GROUP_RANK=3, but this node's first rank is 2 (RANK - LOCAL_RANK): each node before it"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_worker_refused(bad[i].env, bad[i].says, "in the environment", NULL);
    static const struct { const char *env, *view; } good[] = {
        {"RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 TORCHELASTIC_RUN_ID=x",
         "rank 3 local 1/2 world 4 node 1"},
        {"RANK=5 WORLD_SIZE=7 LOCAL_RANK=1 LOCAL_WORLD_SIZE=3 GROUP_RANK=1 TORCHELASTIC_RUN_ID=x",
         "rank 5 local 1/3 world 7 node 1"},
        {"RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 GROUP_RANK=1", "rank 1 local 0/2 world 2 node 1"},
        {"SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=4 SLURM_LOCALID=0 SLURM_NODEID=1 SLURM_TASKS_PER_NODE=2(x2)",
         "rank 1 local 0/2 world 4 node 1"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) expect_worker_view(good[i].env, good[i].view);
}
END_TEST

/* An sbatch script's `export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS` is evaluated once: every
 * srun task had RANK=0 and was rank 0 — failing as 'two workers given RANK=0' (or 'not an address of
 * this machine' on another node) with advice to unset them and let stage3 launch; RANK=0 WORLD_SIZE=1
 * left over in a shell made each task a job of its own. A RANK that differs from srun's or mpirun's
 * rank in a world of their size, and a world smaller than their tasks, are now refused naming both
 * and the fix; the same values per task, torchrun's own (inside srun) and a launcher of the user's
 * own in each task (a larger world) still pass. */
START_TEST(rank_exported_to_every_task_is_refused) {
    static const struct { const char *env, *says; } bad[] = {
        {"RANK=0 WORLD_SIZE=2 SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_NTASKS=2",
         "this is srun's task SLURM_PROCID=1 of 2, but RANK=0 WORLD_SIZE=2 — given to every task alike"},
        {"RANK=0 WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4",
         "this is mpirun's task OMPI_COMM_WORLD_RANK=3 of 4, but RANK=0 WORLD_SIZE=4"},
        /* a smaller world: left over in a shell, each task was a job of its own, task 0 too */
        {"RANK=0 WORLD_SIZE=1 SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=2",
         "this is srun's task SLURM_PROCID=0 of 2, but RANK=0 WORLD_SIZE=1 — given to every task alike"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_worker_refused(bad[i].env, bad[i].says, "own variables decide", "to let stage3 start its own workers");
    static const struct { const char *env, *view; } good[] = {
        {"RANK=1 WORLD_SIZE=2 SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_NTASKS=2",
         "rank 1 local 1/2 world 2 node 0 port 29500 via environment"},
        {"RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 TORCHELASTIC_RUN_ID=x SLURM_STEP_ID=0 "
         "SLURM_PROCID=1 SLURM_LOCALID=0 SLURM_NTASKS=2", "rank 3 local 1/2 world 4 node 1 port 29500 via torchrun"},
        {"RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 SLURM_STEP_ID=0 SLURM_PROCID=1 "
         "SLURM_LOCALID=0 SLURM_NTASKS=2", "rank 3 local 1/2 world 4 node 1 port 29500 via environment"},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) expect_worker_view(good[i].env, good[i].view);
}
END_TEST

/* What is not a task of an srun step launches here: an sbatch script (SLURM_PROCID=0 and the job's
 * SLURM_NTASKS, but no step id) used to make ./stage3 rank 0 of the job's tasks, waiting
 * --rdzv-timeout for ranks that never start; the shell of srun --pty bash (a step of one task) used
 * to refuse --nproc-per-node. Both now run our own launcher; the batch script says how to use every
 * task. */
START_TEST(slurm_batch_script_and_one_task_step_launch_here) {
    static const struct { const char *env; int note; } cases[] = {
        {"SLURM_JOB_ID=7 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_NTASKS=4", 1},
        {"SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1 SLURM_STEP_NUM_TASKS=1", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[512], *out;
        snprintf(args, sizeof args, TINY " --steps 2 --nproc-per-node 2 --rdzv-timeout 20 --master-port %d",
                 test_free_port());
        int rc = stage3(cases[i].env, args, &out);
        ck_assert_msg(rc == 0 && strstr(out, "launching 2 workers on this node (ranks 0-1 of 2") &&
                          strstr(out, "summary:") &&
                          !strstr(out, "this is its batch script, not an srun task") == !cases[i].note,
                      "%s: exit %d\n%s", cases[i].env, rc, out);
        free(out);
    }
}
END_TEST

/* MPICH's and Intel MPI's mpirun give PMI_RANK and PMI_SIZE (and Hydra MPI_LOCALRANKID, MPI_LOCALNRANKS):
 * its tasks form one job. Unread, each task started a launcher of its own: one trained a job of its
 * own two workers, the other's rank 0 found that job's store on the port and failed. */
START_TEST(mpich_mpirun_tasks_form_one_job) {
    char cmd[4096], *out;
    int port = test_free_port();
    snprintf(cmd, sizeof cmd,
             "(PMI_RANK=0 PMI_SIZE=2 MPI_LOCALRANKID=0 MPI_LOCALNRANKS=2 " LIMIT "%s/stage3 " TINY " --steps 2 "
             "--rdzv-timeout 20 --master-port %d & PMI_RANK=1 PMI_SIZE=2 MPI_LOCALRANKID=1 MPI_LOCALNRANKS=2 " LIMIT
             "%s/stage3 " TINY " --steps 2 --rdzv-timeout 20 --master-port %d; r1=$?; wait $!; r0=$?; "
             "echo \"exit codes $r0 $r1\")", test_root(), port, test_root(), port);
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "exit codes 0 0") && strstr(out, "ddp: 2 ranks") && strstr(out, "summary:") &&
                  !strstr(out, "launching"), "%s", out);
    free(out);
}
END_TEST

/* Node 0 runs ./stage3 and node 1 ./stage4 (another program, with other flags): refused at once as
 * different programs, on both nodes, before any flag is compared. */
START_TEST(different_stages_on_two_nodes_are_refused) {
    char *out;
    run_two_nodes("stage3", "--steps 2 --nproc-per-node 1", "stage4", "--steps 2 --nproc-per-node 1", &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "the ranks run different programs") &&
                      !strstr(out, "started with different --"), "%s", out);
    free(out);
    /* …and stage 3 built from other sources: the same flags, so nothing else told the two apart — two
     * builds one commit apart (7cddf9e, 7ea1d92) planned different buckets under --bucket-mb 0.1 and
     * trained on, exit 0, their losses apart from step 3 (from the cross-rank audit). This copy has
     * another source fingerprint (cli.c's source_id, every copy of its text changed). */
    char *dir = test_tmpdir(), path[1024];
    snprintf(path, sizeof path, "%s/stage3", test_root());
    long size;
    char *bin = test_slurp(path, &size);
    ck_assert_ptr_nonnull(bin);
    static const char marker[] = "stage source id ";
    int changed = 0;
    for (char *at = bin; (at = memmem(at, (size_t)(bin + size - at), marker, sizeof marker - 1)); changed++) {
        at += sizeof marker - 1;
        *at = *at == '1' ? '2' : '1';
    }
    ck_assert_msg(changed > 0, "no source fingerprint in %s", path);
    snprintf(path, sizeof path, "%s/stage3", dir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq((long)fwrite(bin, 1, (size_t)size, f), size);
    fclose(f);
    free(bin);
    chmod(path, 0755);
    run_two_nodes("stage3", "--steps 2 --nproc-per-node 1", path, "--steps 2 --nproc-per-node 1", &out);
    ck_assert_msg(strstr(out, "exit codes 2 2") && strstr(out, "the ranks run different programs"), "%s", out);
    free(out);
    free(dir);
}
END_TEST

/* The launcher's last resort (launch.c, stop_all): a worker still alive LAUNCH_GRACE_S after its SIGTERM
 * — stuck in a driver call — gets a SIGKILL, and that kill is the launcher's, not the worker's failure.
 * Here the workers ignore SIGTERM (ignored by whoever started the launcher: it stays ignored, in the
 * workers too), so a SIGHUP to the launcher, passed on as a SIGTERM, stops nothing; after LAUNCH_STOP_S
 * the launcher stops them (SIGTERM: ignored again) and LAUNCH_GRACE_S later kills them: exit 129, an
 * interruption, no worker left. Without the SIGKILL the launcher waited for ever (and the job with it);
 * with its kills counted as the workers' own failures it reported "job failed … SIGKILL" and an OOM hint.
 * SIGHUP is restored with env: a suite started under nohup ignores it, and the launcher would keep it
 * ignored too (as it should), so the test would wait for a stop that never comes. */
START_TEST(workers_that_ignore_sigterm_are_killed) {
    char *dir = test_tmpdir(), cmd[4096], *out;
    const int limit = (int)((LAUNCH_STOP_S + LAUNCH_GRACE_S + 30) * 10 * test_time_scale()); /* in 0.1 s */
    snprintf(cmd, sizeof cmd,
             "D=%s; (trap '' TERM; exec env --default-signal=HUP %s/stage3 " TINY " --epochs 100000 --nproc-per-node 2 --master-port %d "
             "> $D/out.txt 2>&1) & run=$!; "
             "while ! grep -qs 'buckets rebuilt' $D/out.txt && kill -0 $run 2>/dev/null; do sleep 0.01; done; "
             "kids=$(cat /proc/$run/task/$run/children); t0=$(date +%%s); kill -HUP $run; "
             "i=0; while kill -0 $run 2>/dev/null && [ $i -lt %d ]; do sleep 0.1; i=$((i+1)); done; "
             "kill -9 $run 2>/dev/null && echo 'launcher still running: killed'; wait $run; echo \"exit $?\"; "
             "echo \"took $(( $(date +%%s) - t0 )) s\"; "
             "for k in $kids; do kill -0 $k 2>/dev/null && echo \"LEFTOVER worker $k\" && kill -9 $k; done; cat $D/out.txt",
             dir, test_root(), test_free_port(), limit);
    test_run(cmd, &out);
    long took = -1;
    const char *t = strstr(out, "took ");
    if (t) sscanf(t, "took %ld s", &took);
    ck_assert_msg(strstr(out, "exit 129") && strstr(out, "interrupted by SIGHUP: stopped all 2 workers") &&
                      !strstr(out, "job failed") && !strstr(out, "out-of-memory") && !strstr(out, "LEFTOVER") &&
                      took >= (long)(LAUNCH_STOP_S + LAUNCH_GRACE_S) - 1,
                  "workers ignoring SIGTERM were not killed after the grace period (%ld s):\n%s", took,
                  strlen(out) > 3000 ? out + strlen(out) - 3000 : out); /* a Check message has a limit */
    free(out), free(dir);
}
END_TEST

/* Every rank needs the job's rendezvous secret (auth.h); the launcher's own tests start without it. */
static void secret_setup(void) { setenv("STAGE_RDZV_SECRET", TEST_SECRET, 1); }

Suite *suite_dist(void) {
    Suite *s = suite_create("dist");
    TCase *tc = tcase_create("dist");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, secret_setup, NULL);
    tcase_add_test(tc, show_sampler_prints_the_shard);
    tcase_add_test(tc, store_set_get_add_barrier);
    tcase_add_test(tc, store_bounds_message_sizes);
    tcase_add_test(tc, store_rendezvous_timeouts_are_clear);
    tcase_add_test(tc, a_loopback_master_addr_is_named_on_timeout);
    tcase_add_test(tc, store_port_in_use_is_clear);
    tcase_add_test(tc, store_closed_before_its_greeting_names_rank_0);
    tcase_add_test(tc, store_bad_master_addr_is_clear);
    tcase_add_test(tc, an_exported_master_addr_is_named);
    tcase_add_test(tc, a_missing_rank_names_the_launchers_variables);
    tcase_add_test(tc, too_few_file_descriptors_is_clear);
    tcase_add_test(tc, net_edges_file_limit_and_closed_peer);
    tcase_add_test(tc, host_ring_allreduce_is_exact);
    tcase_add_test(tc, host_ring_16bit_mean_is_pytorchs);
    tcase_add_test(tc, host_ring_f32_mean_is_pytorchs);
    tcase_add_test(tc, host_ring_issue_waits_for_a_free_slot);
    tcase_add_test(tc, ranks_on_different_communicators_are_refused);
    tcase_add_test(tc, launcher_refuses_bad_flags);
    tcase_add_test(tc, launcher_stops_everyone_when_a_rank_fails);
    tcase_add_test(tc, a_closed_output_stops_the_job_quietly);
    tcase_add_test(tc, a_failure_waits_for_the_checkpoint_being_written);
    tcase_add_test(tc, launcher_reports_failure_with_sigchld_ignored);
    tcase_add_test(tc, fail_at_injects_where_it_says);
    tcase_add_test(tc, cpu_fallback_is_noted_only_under_auto);
    tcase_add_test(tc, stop_signals_request_pass_and_second);
    tcase_add_test(tc, a_signal_sent_twice_is_one_request);
    tcase_add_test(tc, a_second_signal_during_a_deferred_save_stops_at_once);
    tcase_add_test(tc, save_delay_bounds_and_die_collateral_hook);
    tcase_add_test(tc, workers_under_torchrun_and_srun_variables);
    tcase_add_test(tc, two_nodes_and_mismatched_flags);
    tcase_add_test(tc, resume_on_one_node_only_is_refused);
    tcase_add_test(tc, save_on_node_0_alone_still_stops_cleanly);
    tcase_add_test(tc, nodes_reading_other_data_are_refused);
    tcase_add_test(tc, a_second_rank_0_is_named);
    tcase_add_test(tc, two_jobs_sharing_an_exported_secret_stay_apart);
    tcase_add_test(tc, standalone_jobs_pick_ports_of_their_own);
    tcase_add_test(tc, standalone_hands_its_listening_socket_to_rank_0);
    tcase_add_test(tc, gpu_and_cpu_nodes_are_refused);
    tcase_add_test(tc, srun_ranks_agree_on_the_resume);
    tcase_add_test(tc, mismatched_world_size_stops_every_node_at_once);
    tcase_add_test(tc, launcher_names_one_first_failure);
    tcase_add_test(tc, launcher_names_the_first_failure_while_it_exits);
    tcase_add_test(tc, failures_caused_by_a_peer_are_marked_collateral);
    tcase_add_test(tc, barrier_waits_for_every_rank);
    tcase_add_test(tc, a_rank_claimed_twice_is_refused);
    tcase_add_test(tc, two_nodes_of_two_workers);
    tcase_add_test(tc, worker_gpu_follows_its_local_rank);
    tcase_add_test(tc, node_gpus_count_each_tasks_own);
    tcase_add_test(tc, worker_variables_out_of_range_are_refused);
    tcase_add_test(tc, per_task_gpu_under_srun_and_mpirun);
    tcase_add_test(tc, worker_view_from_launcher_variables);
    tcase_add_test(tc, torchrun_layouts_that_cannot_be_are_refused);
    tcase_add_test(tc, rank_exported_to_every_task_is_refused);
    tcase_add_test(tc, slurm_batch_script_and_one_task_step_launch_here);
    tcase_add_test(tc, different_stages_on_two_nodes_are_refused);
    tcase_add_test(tc, mpich_mpirun_tasks_form_one_job);
    suite_add_tcase(s, tc);
    TCase *kill9 = tcase_create("stop_all_kill"); /* its own case: 35 s of waiting (CK_RUN_CASE=stop_all_kill) */
    tcase_set_timeout(kill9, 300);
    tcase_add_checked_fixture(kill9, secret_setup, NULL);
    tcase_add_test(kill9, workers_that_ignore_sigterm_are_killed);
    suite_add_tcase(s, kill9);
    TCase *nccl = tcase_create("nccl"); /* CK_RUN_CASE=nccl: the GPU's one test, without the launcher's */
    tcase_set_timeout(nccl, 120);
    tcase_add_checked_fixture(nccl, secret_setup, NULL);
    tcase_add_test(nccl, nccl_sums_more_doubles_than_its_scratch);
    suite_add_tcase(s, nccl);
    return s;
}
