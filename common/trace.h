/* trace.h — a timeline of a few training steps (`--trace FILE`, `--trace-steps A:B`), as a Chrome
 * trace-event JSON file that Perfetto (ui.perfetto.dev, or a local copy) and chrome://tracing open.
 *
 * Why: the stages' reports say how long each phase took; a timeline shows *why* — DataParallel's
 * replica threads taking turns on the GIL and planning their convolutions again, DDP's all-reduce
 * running on the communication stream while backward goes on. `make timeline` draws the same file
 * as an SVG picture (tests/timeline.py).
 *
 * What is recorded, only inside the window of optimizer steps A ≤ step < B:
 *  - host spans per thread (trace_begin / trace_end, or trace_complete with times already taken):
 *    the main loop's steps and input, loader workers, DataParallel's phases and replica threads,
 *    the GIL held / waited for, convolution planning, DDP's bucket launches, the host ring's
 *    all-reduces;
 *  - device spans per stream (trace_dev_begin / trace_dev_end): forward, backward, optimizer, each
 *    bucket's all-reduce on the communication stream, host↔device and peer copies. On CUDA a span is
 *    a pair of CUDA events recorded on the stream; the pairs are resolved to times when the window
 *    closes. Alignment with the host clock: when the window opens, a reference event is recorded on
 *    each device's compute stream and waited for (cudaEventSynchronize), and the host clock read at
 *    that moment is its time; every other event's time is that plus cudaEventElapsedTime(ref, ev).
 *    The error is the wake-up latency of that one wait (microseconds); the one synchronisation
 *    perturbs the first traced step a little, which is why the default window starts after the
 *    warm-up. On the CPU backend the work runs in the calling thread, so a device span is the wall
 *    clock around the same phase, drawn on the device's lane.
 * One process track per rank (pid = rank). A run with several processes (stages 3–5) writes
 * FILE.rankN.json per rank; rank 0 merges them into FILE at the end (run_finish, after a barrier).
 * All ranks of one node share CLOCK_MONOTONIC, so the merged tracks line up. Every file is written
 * as NAME.tmp (opened at start-up, so an unwritable place fails at once) and renamed to NAME only
 * when complete: a run that crashes or is killed leaves the previous NAME as it was (and an empty
 * NAME.tmp, emptied again by the next run). One that stops diverged, or on a signal with --save,
 * writes it (trainer.c).
 *
 * Cost: with --trace off (or outside the window) every hook is one predictable branch on a global
 * flag. Inside the window a span is two clock reads (or two cudaEventRecord) and one atomic
 * increment to claim a slot in a buffer preallocated when the trace is configured; no locks, no
 * allocation. A full buffer drops spans and says so at the end.
 *
 * NVTX: CUDA builds also push NVTX ranges with the same names (NVTX3, header-only, from the CUDA
 * toolkit), always — not only in the window — so `nsys profile ./stageN ...` shows them; without a
 * profiler attached an NVTX call is a test of one function pointer. */
#ifndef TRACE_H
#define TRACE_H

#include <stdatomic.h>
#include <stdint.h>

struct Device; /* device.h: not included, so that host-only code (the GIL) can trace */

#ifdef USE_CUDA
#include <nvtx3/nvToolsExt.h>
#define TRACE_NVTX_PUSH(name) nvtxRangePushA(name)
#define TRACE_NVTX_POP() nvtxRangePop()
#else
#define TRACE_NVTX_PUSH(name) ((void)0)
#define TRACE_NVTX_POP() ((void)0)
#endif

#define TRACE_DEFAULT_STEPS "5:8"
#define TRACE_MAX_DEVICES 64 /* devices that get lanes of their own (stage 2's --gpus at most) */

extern atomic_int trace_active_; /* inside the window: the one flag every hook tests */
static inline int trace_on(void) {
    return __builtin_expect(atomic_load_explicit(&trace_active_, memory_order_relaxed), 0);
}

/* Parse --trace-steps "A:B" (0 ≤ A < B; optimizer steps, half-open): die_user with the fix on a bad
 * value. Used by config_resolve, so a bad flag is refused before anything starts. */
void trace_parse_steps(const char *flag, int64_t *a, int64_t *b);

/* The launcher's look (stages 3–5), before any worker: the files ranks first … first+n-1 of world would
 * write refused as trace_configure would refuse them — another run's lock, another user's file — not
 * after the rendezvous. Creates nothing. */
void trace_check_free(const char *file, int first, int n, int world);

/* The run's side (called by trainer.c): configure from the flags (file "" = off) for this process's
 * rank / world and its devices, opening the .tmp files; step(n) after each optimizer step with n =
 * steps done (and once at the start), which opens and closes the window; finish writes what is left
 * and renames it into place. world > 1: every rank writes FILE.rankN.json; merge (rank 0, after a
 * barrier, so every rank file is complete) joins them into FILE. */
void trace_configure(const char *file, const char *steps, int rank, int world, const char *process,
                     struct Device **devs, int n_devs);
void trace_step(int64_t steps_done);
void trace_finish(void);            /* close the window if open; write this process's file */
int trace_wants_merge(void);        /* world > 1 and tracing: the caller barriers, then rank 0 merges */
void trace_merge(void);
/* Rank 0, once every rank has configured its trace (after a barrier): whether rank r's file in the making
 * (NAME.rankR.json.tmp, opened by trace_configure) is where trace_merge will look for it, its own --trace
 * NAME — not when a node wrote another NAME, or to a disk that rank 0 does not share. */
int trace_rank_file_seen(int r);
/* Evaluation is not part of the window: pause and resume around it. */
int trace_pause(void);
void trace_resume(int was_on);

/* Name the calling thread's lane ("loader worker 2", "replica 1"). Threads with the same name share a
 * lane (stage 2 starts new replica threads every step: one lane per replica, not per thread). */
void trace_thread_name(const char *name);

/* ---- host spans: on the calling thread's lane ------------------------------------------------ */
typedef struct TraceSpan {
    const char *name, *cat;
    int64_t t0;  /* ns; 0: not recording */
    int64_t arg; /* shown as args.n (a bucket, a batch, a step); −1: none */
} TraceSpan;
TraceSpan trace_begin_(const char *name, const char *cat, int64_t arg);
void trace_end_(TraceSpan s);
static inline TraceSpan trace_begin(const char *name, const char *cat, int64_t arg) {
    TRACE_NVTX_PUSH(name);
    if (!trace_on()) return (TraceSpan){0};
    return trace_begin_(name, cat, arg);
}
static inline void trace_end(TraceSpan s) {
    TRACE_NVTX_POP();
    if (s.t0) trace_end_(s);
}
/* A span whose times (time_now() seconds) were taken already (the GIL's waits and holds). */
void trace_complete_(const char *name, const char *cat, double t0, double t1, int64_t arg);
static inline void trace_complete(const char *name, const char *cat, double t0, double t1, int64_t arg) {
    if (trace_on()) trace_complete_(name, cat, t0, t1, arg);
}

/* ---- device spans: on a device's stream lane ---------------------------------------------------- */
typedef enum { TRACE_COMPUTE, TRACE_COPY, TRACE_COMM, TRACE_LANES } TraceLane;
typedef struct TraceDev {
    int slot;    /* CUDA: the event pair in the device's pool; −1: not recording */
    int dev;     /* registered device number */
    int64_t t0;  /* CPU backend: ns */
    const char *name, *cat;
    int64_t arg;
    int64_t step; /* the optimizer step it was issued in (written as args.step) */
    void *stream;
} TraceDev;
/* stream: the CUDA stream the work is issued on (NULL: the lane's own stream of d). */
TraceDev trace_dev_begin_(struct Device *d, TraceLane lane, void *stream, const char *name, const char *cat,
                          int64_t arg);
void trace_dev_end_(TraceDev s);
static inline TraceDev trace_dev_begin(struct Device *d, TraceLane lane, void *stream, const char *name,
                                       const char *cat, int64_t arg) {
    TRACE_NVTX_PUSH(name);
    if (!trace_on()) return (TraceDev){.slot = -1, .dev = -1};
    return trace_dev_begin_(d, lane, stream, name, cat, arg);
}
static inline void trace_dev_end(TraceDev s) {
    TRACE_NVTX_POP();
    if (s.dev >= 0) trace_dev_end_(s);
}

#endif
