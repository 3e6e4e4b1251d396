/* stop.h — Ctrl-C, or a scheduler's SIGTERM, stops a run that saves (--save) cleanly: at a step
 * boundary, with a checkpoint of that step, instead of losing everything since the last one.
 *
 * What you will learn:
 *   - why a signal handler may only set a flag (the step in flight is a stream of GPU work and
 *     half-written buffers; the loop, not the handler, decides where to stop);
 *   - why a job of processes must agree on the step first: each rank gets the signal at a different
 *     point of its loop, and rank 0 may only save a step that every rank has finished. The ranks
 *     vote where they already sum something (trainer.c), so agreeing costs no collective of its own;
 *   - the launcher's part: workers run in sessions of their own (as torchrun's do), so a terminal's
 *     Ctrl-C reaches the launcher alone, which passes it on once and waits for them (launch.c).
 *
 * A second signal stops the process at once, without saving (the default action): the way out of a
 * stop that takes too long. The same signal again from the same process within a second is not a
 * second one but the first passed on twice (GNU timeout sends it to its child, then to its group).
 * Without --save (on the job's rank 0) nothing is installed and a signal ends the run at once. */
#ifndef STOP_H
#define STOP_H

#include <signal.h>
#include <stdint.h>

/* Catch SIGINT and SIGTERM from now on — unless ignored when we started (a shell script's background
 * job ignores SIGINT, so that the script's Ctrl-C spares it; that choice is kept). notice: a line the
 * handler writes to stderr when the first one arrives (after "PROG: SIGxxx — "), or NULL to stay
 * silent (ranks other than 0). */
void stop_install(const char *prog, const char *notice);
/* The first such signal received (SIGINT or SIGTERM), or 0. Async-signal-safe to read, cheap. */
int stop_requested(void);
/* A clean stop is requested, or our launcher has just passed one on (async-signal-safe): then a lost
 * standard output is no reason to die unsaved — the reader (`| tee`) took the same Ctrl-C (cli.c). */
int stop_coming(void);
/* Around a checkpoint write. A rank that fails elsewhere makes our launcher stop every worker at once
 * (SIGTERM, then SIGKILL); the state being written is complete — every rank finished that step — so
 * the stop waits until it is on disk, then takes effect. A second signal still stops at once. */
void stop_save_begin(void);
void stop_save_end(void);

/* A signal's sender (a process's pid for a kill(2), else 0: the terminal's Ctrl-C comes from the
 * kernel) and arrival time. The same signal from the same process within a second of the first is
 * that request again, not a second one: GNU timeout passes a signal on to its child, then to its
 * process group. Used here and by the launcher (launch.c); both async-signal-safe. */
typedef struct {
    int sig, from;
    int64_t ns;
} SignalSender;
SignalSender signal_sender(int sig, const siginfo_t *si);
int signal_repeats(const SignalSender *first, const SignalSender *now);

#endif
