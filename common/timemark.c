/* timemark.c — see timemark.h. */
#include "timemark.h"

#include <string.h>

void timemark_init(TimeMark *m, Device *d) {
    memset(m, 0, sizeof *m);
#ifdef USE_CUDA
    if (d->kind == DEV_CUDA) {
        device_bind(d);
        CHECK_CUDA(cudaEventCreate(&m->ev));
    }
#else
    (void)d;
#endif
}

void timemark_destroy(TimeMark *m) {
#ifdef USE_CUDA
    if (m->ev) cudaEventDestroy(m->ev);
    m->ev = NULL;
#else
    (void)m;
#endif
}

void timemark_record(TimeMark *m, Device *d) {
#ifdef USE_CUDA
    if (m->ev) {
        device_bind(d);
        CHECK_CUDA(cudaEventRecord(m->ev, d->stream));
        return;
    }
#endif
    (void)d;
    m->t = time_now();
}

double timemark_ms(const TimeMark *a, const TimeMark *b) {
#ifdef USE_CUDA
    if (b->ev) {
        float ms = 0;
        CHECK_CUDA(cudaEventSynchronize(b->ev));
        CHECK_CUDA(cudaEventElapsedTime(&ms, a->ev, b->ev));
        return ms;
    }
#endif
    return 1e3 * (b->t - a->t);
}
