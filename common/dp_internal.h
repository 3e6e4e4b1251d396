/* dp_internal.h — what the DataParallel files share with each other, and nobody else needs.
 *
 * DataParallel is one object (dp.h) spread over four files, one job each:
 *   dp.c         the step (scatter, replicate, parallel_apply, gather, backward, reduce-add), the
 *                copies between devices and the stream ordering that makes them correct, setup;
 *   dp_threads.c the threads that run the replicas: parallel_apply's forward threads (new each
 *                step, or a persistent pool) and the autograd device threads for backward;
 *   dp_python.c  the modelled Python: the calibrated costs, stage 2's flags, the GIL charges;
 *   dp_report.c  phase timing and the report (phases, modelled Python, GIL statistics). */
#ifndef DP_INTERNAL_H
#define DP_INTERNAL_H

#include "dp.h"

/* ---- dp.c: cross-device ordering events (no-ops on the CPU backend) ---- */
void dp_event_create(Device *d, DpEvent *e);
void dp_event_destroy(Device *d, DpEvent e);
void dp_event_record(Device *d, DpEvent e); /* on d's compute stream */
void dp_event_wait(Device *d, DpEvent e);   /* d's compute stream waits for e; the host does not */

/* ---- dp_threads.c ---- */
void dp_threads_start(DataParallel *dp);
void dp_threads_stop(DataParallel *dp);
/* Every replica's forward, in parallel_apply's threads (or in this thread when there is one). */
void dp_forward_replicas(DataParallel *dp);
/* Every replica's backward, in the device threads; returns when all are issued. */
void dp_backward_replicas(DataParallel *dp);

/* ---- dp_python.c ---- */
/* What replicate copies, the --gil-host-us scale, whether any Python is modelled; the GIL. */
void dp_python_init(DataParallel *dp);
/* Run `us` µs of modelled Python in thread t, holding the GIL; add it to *charged_s. */
void dp_interpret(DataParallel *dp, GilThread *t, double us, double *charged_s);
/* A blocking call returned (join, Event.wait, backward): the thread needs the GIL to go on. */
void dp_gil_roundtrip(DataParallel *dp, GilThread *t);

/* ---- dp_report.c ---- */
void dp_timing_init(DataParallel *dp, int steps_cap);
void dp_timing_destroy(DataParallel *dp);
/* Mark 0 (the step starts) or the end of phase p, on device 0's stream (or the wall clock). */
void dp_mark(DataParallel *dp, int m);

#endif
