/* stop.c — the signal side of a clean stop (stop.h): a flag, and a line that says what happens next. */
#include "stop.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "worker_status.h"

static volatile sig_atomic_t requested; /* the first signal, 0 before any */
static int claimed;                     /* a handler is recording the first signal (set once) */
static SignalSender first;              /* its sender and time */
static volatile sig_atomic_t installed; /* stop_install ran: a signal here is a request to save */
static volatile sig_atomic_t saving, deferred; /* a checkpoint write in progress; the abort it held back */
static char notice_int[600], notice_term[600]; /* written whole by the handler (write(2) is safe there) */
static size_t len_int, len_term;

/* A person's second Ctrl-C comes from the terminal (the kernel), and a second `kill` from a new
 * process: neither is a repeat, both still stop at once. */
#define SAME_REQUEST_NS 1000000000LL

SignalSender signal_sender(int sig, const siginfo_t *si) {
    SignalSender s = {sig, si && si->si_code == SI_USER ? (int)si->si_pid : 0, status_clock_ns()};
    return s; /* clock_gettime: async-signal-safe */
}

int signal_repeats(const SignalSender *first_one, const SignalSender *now) {
    return now->sig == first_one->sig && now->from && now->from == first_one->from &&
           now->ns - first_one->ns < SAME_REQUEST_NS;
}

static void die_of(int sig) { /* its default action, now: the process dies of it, unsaved */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_stop(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    if (launch_abort_requested()) { /* our launcher's SIGTERM after a failure elsewhere */
        if (saving && !deferred) { /* finish the checkpoint first (stop_save_end dies then) */
            deferred = sig;
            return;
        }
        die_of(sig);
        return;
    }
    SignalSender now = signal_sender(sig, si);
    /* Exchanged, not tested then set: two signals that arrive together may run this on two threads. */
    if (__atomic_exchange_n(&claimed, 1, __ATOMIC_SEQ_CST)) {
        /* The first is being recorded on another thread (the mask keeps this one out of its own
         * handler): a few instructions away. */
        while (!__atomic_load_n(&requested, __ATOMIC_ACQUIRE)) {
        }
        if (signal_repeats(&first, &now)) return; /* the first, passed on twice */
        /* The second — unless it is the pair a scheduler's SIGTERM to every process makes, in either
         * order: from it, and passed on by our launcher; the launcher's token says so, once. */
        if (!launch_take_passed(sig)) die_of(sig);
        return;
    }
    first = now;
    __atomic_store_n(&requested, sig, __ATOMIC_RELEASE);
    launch_mark_stopping(sig); /* our launcher waits for a worker on its way to a clean stop */
    int e = errno; /* the interrupted code may be about to read it */
    ssize_t w = sig == SIGTERM ? write(2, notice_term, len_term) : write(2, notice_int, len_int);
    (void)w;
    errno = e;
}

void stop_install(const char *prog, const char *notice) {
    if (notice) {
        /* a leading newline: the progress bar may be half-way through its line */
        snprintf(notice_int, sizeof notice_int, "\n%s: SIGINT — %s (press Ctrl-C again to stop at once, unsaved)\n",
                 prog, notice);
        snprintf(notice_term, sizeof notice_term, "\n%s: SIGTERM — %s (a second signal stops it at once, unsaved)\n",
                 prog, notice);
        len_int = strlen(notice_int), len_term = strlen(notice_term);
    }
    /* SA_RESTART: a read or write that the signal interrupts carries on (poll() loops retry on EINTR) */
    struct sigaction sa = {.sa_sigaction = on_stop, .sa_flags = SA_RESTART | SA_SIGINFO}, old;
    sigemptyset(&sa.sa_mask); /* both blocked in the handler: neither interrupts the other's record */
    sigaddset(&sa.sa_mask, SIGINT), sigaddset(&sa.sa_mask, SIGTERM);
    const int sigs[] = {SIGINT, SIGTERM};
    installed = 1;
    for (int i = 0; i < 2; i++) /* one ignored by whoever started us stays ignored (as Python does): a */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) /* script's `cmd &`, nohup */
            sigaction(sigs[i], &sa, NULL);
}

int stop_requested(void) { return requested; }

int stop_coming(void) { return requested || (installed && launch_passed_signal()); }

void stop_save_begin(void) {
    saving = 1;
    launch_mark_saving(1);
}

void stop_save_end(void) {
    saving = 0;
    launch_mark_saving(0);
    if (deferred) {
        static const char msg[] = "stopping now, as the job asked while the checkpoint above was being written: it "
                                  "is complete\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        die_of(deferred);
    }
}
