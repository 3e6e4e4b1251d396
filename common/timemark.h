/* timemark.h — a point in time on a device's compute stream, for timing work without stalling it.
 *
 * On CUDA a TimeMark is an event recorded on the device's compute stream: the time between two
 * marks is what the GPU spent between them, host stalls included, and recording one never waits.
 * On the CPU backend the work runs in the calling thread, so a mark is just the wall clock.
 * Phase timing in stage 2 (DataParallel), the bucket timings of DDP and the per-step times of the
 * trainer all take their marks this way: one helper, so the CPU / CUDA difference lives here only. */
#ifndef TIMEMARK_H
#define TIMEMARK_H

#include "device.h"

typedef struct TimeMark {
    double t;        /* CPU backend: time_now() when recorded */
#ifdef USE_CUDA
    cudaEvent_t ev;  /* CUDA device: a timing event (NULL on the CPU backend) */
#endif
} TimeMark;

/* Create (a timing event on a CUDA device) / destroy. d is the device whose stream is marked. */
void timemark_init(TimeMark *m, Device *d);
void timemark_destroy(TimeMark *m);
/* Mark now: on d's compute stream (asynchronous), or the wall clock. */
void timemark_record(TimeMark *m, Device *d);
/* Milliseconds from a to b (both recorded, a first). CUDA: waits until b has been reached. */
double timemark_ms(const TimeMark *a, const TimeMark *b);

#endif
