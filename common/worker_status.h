/* worker_status.h — the page a launcher shares with its workers, so that a failure names its cause.
 *
 * Our launcher (launch.h) creates one page with a slot per local worker and hands it to each worker
 * as an inherited file descriptor (STAGE3_STATUS_FD). A worker writes, with plain atomic stores, the
 * step it is in, when it called exit(), and whether its failure is only a consequence of another
 * rank's; after a failure the launcher reads the slots to blame the rank that failed first, for a
 * reason of its own. Under another launcher (torchrun, srun, mpirun) there is no page and these
 * calls only do their local part. Anything may call them — the communicator marks its own failures
 * collateral — without depending on the launcher. */
#ifndef WORKER_STATUS_H
#define WORKER_STATUS_H

#include <stdint.h>

/* One cache line per local worker. */
typedef struct StatusSlot {
    int64_t step;        /* step the worker is in (0: still setting up) */
    int64_t exit_ns;     /* status_clock_ns() when it chose to exit (die_*, exit()); 0: it did not (a signal) */
    int64_t collateral;  /* its failure was caused by another rank's */
    int64_t stopped;     /* the signal it stopped early for, saved (stop.h): no failure, 0 if none */
    int64_t stopping;    /* a signal asked it to stop cleanly (set in its handler): it is on its way */
    int64_t abort;       /* set by the launcher: its next SIGTERM is a failure's, stop at once */
    int64_t passed;      /* set by the launcher before it passes a signal on: the same signal from
                          * elsewhere too (a scheduler's SIGTERM to every process) is not a second */
    int64_t saving;      /* a checkpoint write in progress: a failure's stop waits for it (stop.h) */
    int64_t epoch_end;   /* past its last step: evaluating, or at the epoch's checkpoint (until the next step) */
    int64_t on_purpose;  /* the signal STAGE3_FAIL_AT made it raise (test-only): no hint guesses a cause */
} StatusSlot;

/* Launcher: a shared page of n slots; *fd is the descriptor to pass to the workers. */
StatusSlot *status_page_create(int n, int *fd);
/* Worker: map slot local_rank of the page behind fd (fd < 0: no page), and read the test-only
 * STAGE3_FAIL_AT fault for `rank`, and STAGE3_EXIT_DELAY_MS=N: with a page, every exit() of this
 * worker takes N ms longer, in an exit handler that runs before the page's own (as a GPU context's
 * teardown does), so that a test can fail another rank while this one is still exiting. */
void status_attach(int fd, int local_rank, int rank);

/* Worker: "I am in step `step`" (1-based; cheap: one store to shared memory), and the test-only
 * STAGE3_FAIL_AT=r:s[:SIG] fault: rank r exits with code 3 (or kills itself with SIG) at step s. */
void launch_step(int64_t step);
/* Worker: "my steps are done for now: I evaluate, or wait at the epoch's checkpoint" — so that a
 * failure there is not reported as one inside the last step. The next launch_step clears it. */
void launch_mark_epoch_end(void);
/* Worker: the failure about to be reported is a consequence of another rank's (a closed
 * connection, a collective that timed out), so the launcher blames the other one. */
void launch_mark_collateral(void);
/* Worker: it is about to exit 128 + sig because a signal stopped the run cleanly (stop.h) — every
 * rank at the same step — which the launcher reports as a stop, not as a failure to blame. */
void launch_mark_stopped(int sig);
/* Worker, in its signal handler (both async-signal-safe): "a signal asked me to stop cleanly" — so
 * the launcher waits for it instead of killing it after LAUNCH_STOP_S — and "has the launcher
 * asked everyone to stop at once?" (a failure elsewhere: then a SIGTERM is no request to save). */
void launch_mark_stopping(int sig);
int launch_abort_requested(void);
/* Worker: a checkpoint write begins (1) or ends (0): the launcher's SIGKILL after a failure waits
 * for it, up to LAUNCH_SAVE_S (launch.c). The test-only STAGE3_SAVE_DELAY_MS=N holds the write
 * open N ms longer, so that a test can fail another rank meanwhile. */
void launch_mark_saving(int on);
/* Worker, in its handler: is this signal, arriving a second time, the launcher passing on the one
 * already received (consumed once: yes)? */
int launch_take_passed(int sig);
/* Worker (async-signal-safe): the signal the launcher has passed on to it, or 0 — set just before the
 * kill, so it may be on its way still. */
int launch_passed_signal(void);
/* Worker, about to report a peer's loss: if its standard output has no reader any more (`./stage3 |
 * head` ended), that closed pipe is what stopped the job — rank 0 died of it first and said so
 * (cli.c) — so this rank dies of the same SIGPIPE, without a word: a second error about a lost peer
 * would send the reader looking for a failure that did not happen. Returns otherwise. */
void launch_quiet_if_output_gone(void);
/* die_user (code 2) or die_runtime (code 1), marked collateral first when `collateral` is true: for
 * a failure that follows from another rank's — its refusal, its loss, a verdict it left (pass 1) —
 * and for a disagreement every rank finds at once (different flags, a --resume on some ranks),
 * which the job reports as rank 0's (pass rank != 0), so that the launcher names one rank every
 * time instead of whichever exited first. */
_Noreturn void die_collateral(int collateral, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* CLOCK_MONOTONIC in ns (the clock of exit_ns). */
int64_t status_clock_ns(void);
/* "KILL" for SIGKILL, … ("?" for a signal we do not name). */
const char *status_signal_name(int sig);

#endif
