/* worker_status.c — the launcher's shared status page and the worker's side of it (see
 * worker_status.h), with the test-only fault injection of STAGE3_FAIL_AT. */
#include "worker_status.h"

#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "errors.h"

static StatusSlot *my_slot;   /* worker: its slot, or NULL when not started by our launcher */
static int fail_rank = -1, fail_signal = 0;
static int64_t fail_step = -1;
static long save_delay_ms; /* STAGE3_SAVE_DELAY_MS (test-only): a checkpoint write held open this long */
static long exit_delay_ms; /* STAGE3_EXIT_DELAY_MS (test-only): an exit() that takes this long more */
static int my_rank;

int64_t status_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static const struct { const char *name; int sig; } SIGNALS[] = {
    {"HUP", SIGHUP}, {"INT", SIGINT}, {"QUIT", SIGQUIT}, {"ILL", SIGILL}, {"ABRT", SIGABRT},
    {"BUS", SIGBUS}, {"FPE", SIGFPE}, {"KILL", SIGKILL}, {"SEGV", SIGSEGV}, {"PIPE", SIGPIPE},
    {"TERM", SIGTERM}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},
};

const char *status_signal_name(int sig) {
    for (size_t i = 0; i < sizeof SIGNALS / sizeof SIGNALS[0]; i++)
        if (SIGNALS[i].sig == sig) return SIGNALS[i].name;
    return "?";
}

StatusSlot *status_page_create(int n, int *fd) {
    *fd = memfd_create("stage3-status", 0); /* inherited across exec by the workers */
    CHECK_SYS(*fd);
    CHECK_SYS(ftruncate(*fd, (off_t)(n * sizeof(StatusSlot))));
    StatusSlot *slots = mmap(NULL, (size_t)n * sizeof(StatusSlot), PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (slots == MAP_FAILED) die_at(__FILE__, __LINE__, "mmap", errno_string(), NULL);
    return slots;
}

/* ---- the worker side ------------------------------------------------------------------------- */

/* The first call wins: die_* calls it as it decides to exit, the exit handler once exit() gets to it. */
static void note_exit(void) {
    int64_t none = 0;
    if (my_slot)
        __atomic_compare_exchange_n(&my_slot->exit_ns, &none, status_clock_ns(), 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* A slow library teardown, as the CUDA runtime's exit handlers take on a GPU (test-only). */
static void delay_exit(void) {
    struct timespec ts = {exit_delay_ms / 1000, exit_delay_ms % 1000 * 1000000L}, rest;
    while (nanosleep(&ts, &rest) != 0) ts = rest;
}

/* A test-only delay in milliseconds from the environment, 0 when unset. */
static long delay_ms(const char *name) {
    const char *d = getenv(name);
    if (!d || !d[0]) return 0;
    char *end;
    long ms = strtol(d, &end, 10);
    if (*end || ms < 0 || ms > 600000) die_user("%s='%s': expected milliseconds, 0 to 600000", name, d);
    return ms;
}

/* STAGE3_FAIL_AT=r:s[:SIG], STAGE3_SAVE_DELAY_MS=N and STAGE3_EXIT_DELAY_MS=N (test-only). */
static void parse_fail_at(void) {
    save_delay_ms = delay_ms("STAGE3_SAVE_DELAY_MS");
    exit_delay_ms = delay_ms("STAGE3_EXIT_DELAY_MS");
    const char *v = getenv("STAGE3_FAIL_AT");
    if (!v || !v[0]) return;
    char sig[16] = "";
    long long s;
    if (sscanf(v, "%d:%lld:%15s", &fail_rank, &s, sig) < 2 || fail_rank < 0 || s < 1)
        die_user("STAGE3_FAIL_AT='%s': expected RANK:STEP or RANK:STEP:SIGNAL (e.g. 1:3 or 1:3:KILL)", v);
    fail_step = s;
    if (sig[0]) {
        for (size_t i = 0; i < sizeof SIGNALS / sizeof SIGNALS[0]; i++)
            if (!strcmp(sig, SIGNALS[i].name) || (!strncmp(sig, "SIG", 3) && !strcmp(sig + 3, SIGNALS[i].name)))
                fail_signal = SIGNALS[i].sig;
        if (!fail_signal)
            die_user("STAGE3_FAIL_AT='%s': unknown signal '%s' (try KILL, SEGV, TERM, ABRT)", v, sig);
    }
}

void launch_step(int64_t step) {
    if (my_slot) {
        __atomic_store_n(&my_slot->epoch_end, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&my_slot->step, step, __ATOMIC_RELAXED);
    }
    if (step != fail_step || my_rank != fail_rank) return;
    fflush(stdout);
    fprintf(stderr, "rank %d: failing on purpose at step %lld (STAGE3_FAIL_AT=%s)\n", my_rank,
            (long long)step, getenv("STAGE3_FAIL_AT"));
    if (fail_signal) {
        if (my_slot) __atomic_store_n(&my_slot->on_purpose, fail_signal, __ATOMIC_RELAXED);
        signal(fail_signal, SIG_DFL);
        raise(fail_signal);
    }
    die_exit(3); /* as a real failure leaves: its exit time noted first */
}

void launch_mark_epoch_end(void) {
    if (my_slot) __atomic_store_n(&my_slot->epoch_end, 1, __ATOMIC_RELAXED);
}

void launch_mark_stopped(int sig) {
    if (my_slot) __atomic_store_n(&my_slot->stopped, sig, __ATOMIC_RELAXED);
}

void launch_mark_stopping(int sig) {
    if (my_slot) __atomic_store_n(&my_slot->stopping, sig, __ATOMIC_RELAXED);
}

int launch_take_passed(int sig) {
    int64_t want = sig;
    return my_slot && __atomic_compare_exchange_n(&my_slot->passed, &want, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

int launch_passed_signal(void) { return my_slot ? (int)__atomic_load_n(&my_slot->passed, __ATOMIC_SEQ_CST) : 0; }

int launch_abort_requested(void) { return my_slot && __atomic_load_n(&my_slot->abort, __ATOMIC_RELAXED); }

void launch_mark_saving(int on) {
    if (my_slot) __atomic_store_n(&my_slot->saving, on, __ATOMIC_SEQ_CST);
    /* the test's window: a failure elsewhere arrives while this write is in progress */
    if (on && save_delay_ms) {
        struct timespec ts = {save_delay_ms / 1000, save_delay_ms % 1000 * 1000000L}, rest;
        while (nanosleep(&ts, &rest) != 0) ts = rest; /* a deferred SIGTERM interrupts it: sleep on */
    }
}

void launch_mark_collateral(void) {
    if (my_slot) __atomic_store_n(&my_slot->collateral, 1, __ATOMIC_RELAXED);
}

void launch_quiet_if_output_gone(void) {
    struct stat st;
    if (fstat(STDOUT_FILENO, &st) != 0 || !S_ISFIFO(st.st_mode)) return; /* a file or a terminal stays */
    struct pollfd out = {.fd = STDOUT_FILENO, .events = POLLOUT};
    if (poll(&out, 1, 0) != 1 || !(out.revents & POLLERR)) return; /* a pipe polls POLLERR once unread */
    launch_mark_collateral();
    signal(SIGPIPE, SIG_DFL); /* not cli.c's handler: its note is rank 0's to give */
    raise(SIGPIPE);
}

void die_collateral(int collateral, int code, const char *fmt, ...) {
    if (collateral) launch_quiet_if_output_gone();
    if (code == 2 && die_user_hook) die_user_hook();
    if (collateral) launch_mark_collateral();
    va_list ap;
    va_start(ap, fmt);
    die_vcode(code, fmt, ap);
}

void status_attach(int fd, int local_rank, int rank) {
    my_rank = rank;
    parse_fail_at();
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < (size_t)(local_rank + 1) * sizeof(StatusSlot)) return;
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd); /* the mapping stays */
    if (p == MAP_FAILED) return;
    my_slot = (StatusSlot *)p + local_rank;
    die_exit_note = note_exit;
    atexit(note_exit);
    /* registered after note_exit, so it runs before it, as the exit handlers of a library first
     * called later do (the CUDA runtime's) */
    if (exit_delay_ms) atexit(delay_exit);
}
