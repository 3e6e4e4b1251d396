/* clock.h — the host's monotonic clock, in seconds.
 *
 * Host-side timing (data wait, timeouts, the GIL's switch interval, CPU-backend step times) reads
 * this one clock. It lives alone so that code with no device (the TCP store, the GIL) can use it
 * without pulling in device.h. */
#ifndef CLOCK_H
#define CLOCK_H

/* Wall-clock seconds since an arbitrary start (CLOCK_MONOTONIC: never jumps with the date). */
double time_now(void);

#endif
