/* gil.c — CPython's "new GIL" (Python/ceval_gil.c, FORCE_SWITCHING on), see gil.h.
 *
 * take_gil and drop_gil below follow CPython's structure line for line, so the two can be read side
 * by side: the same mutex + condition for the lock, the same switch_mutex + switch_cond for forced
 * switching, the same "timed out and no switch happened" rule for setting the drop request. */
#include "gil.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "errors.h"
#include "trace.h"

void gil_init(Gil *g, double switch_ms) {
    memset(g, 0, sizeof *g);
    ASSERT(switch_ms > 0);
    g->interval_s = switch_ms * 1e-3;
    xmutex_init(&g->mutex);
    xmutex_init(&g->switch_mutex);
    /* timed waits on the monotonic clock, so a wall-clock jump cannot stretch the interval */
    pthread_condattr_t a;
    CHECK_PT(pthread_condattr_init(&a));
    CHECK_PT(pthread_condattr_setclock(&a, CLOCK_MONOTONIC));
    CHECK_PT(pthread_cond_init(&g->cond, &a));
    CHECK_PT(pthread_cond_init(&g->switch_cond, &a));
    pthread_condattr_destroy(&a);
    atomic_init(&g->drop_request, 0);
}

void gil_destroy(Gil *g) {
    pthread_mutex_destroy(&g->mutex);
    pthread_mutex_destroy(&g->switch_mutex);
    pthread_cond_destroy(&g->cond);
    pthread_cond_destroy(&g->switch_cond);
}

void gil_thread_init(GilThread *t, const char *name) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
}

void gil_thread_start(Gil *g, GilThread *t) {
    CHECK_PT(pthread_mutex_lock(&g->mutex));
    t->id = ++g->next_id;
    CHECK_PT(pthread_mutex_unlock(&g->mutex));
}

uint64_t gil_holder(Gil *g) {
    CHECK_PT(pthread_mutex_lock(&g->mutex));
    uint64_t h = g->locked ? g->last_holder : 0;
    CHECK_PT(pthread_mutex_unlock(&g->mutex));
    return h;
}

int gil_waiting(Gil *g) {
    CHECK_PT(pthread_mutex_lock(&g->mutex));
    int w = g->waiting;
    CHECK_PT(pthread_mutex_unlock(&g->mutex));
    return w;
}

static struct timespec deadline_after(double s) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = ts.tv_nsec + (long long)(s * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    return ts;
}

void gil_acquire(Gil *g, GilThread *t) {
    ASSERT(t->id != 0); /* gil_thread_start first */
    double t0 = time_now();
    int blocked = 0;
    CHECK_PT(pthread_mutex_lock(&g->mutex));
    while (g->locked) {
        blocked = 1;
        uint64_t saved_switchnum = g->switch_number;
        struct timespec dl = deadline_after(g->interval_s);
        g->waiting++;
        int rc = pthread_cond_timedwait(&g->cond, &g->mutex, &dl);
        g->waiting--;
        if (rc != 0 && rc != ETIMEDOUT) die_at(__FILE__, __LINE__, "pthread_cond_timedwait", strerror(rc), NULL);
        /* Timed out and nobody else got the lock meanwhile: ask the holder to drop it. */
        if (rc == ETIMEDOUT && g->locked && g->switch_number == saved_switchnum) {
            atomic_store(&g->drop_request, 1);
            t->drop_requests++;
        }
    }
    /* switch_mutex is taken before last_holder changes: a forced dropper reads it under it */
    CHECK_PT(pthread_mutex_lock(&g->switch_mutex));
    g->locked = 1;
    if (g->last_holder != t->id) {
        if (g->last_holder != 0) g->handoffs++;
        g->last_holder = t->id;
        g->switch_number++;
    }
    CHECK_PT(pthread_cond_signal(&g->switch_cond));
    CHECK_PT(pthread_mutex_unlock(&g->switch_mutex));
    /* whoever takes the lock clears a pending request (CPython: RESET_GIL_DROP_REQUEST) */
    atomic_store(&g->drop_request, 0);
    CHECK_PT(pthread_mutex_unlock(&g->mutex));
    double now = time_now();
    if (blocked) trace_complete("GIL wait", "gil", t0, now, -1);
    t->waited_s += now - t0;
    t->t_taken = now;
    t->acquires++;
}

void gil_release(Gil *g, GilThread *t) {
    double now = time_now();
    trace_complete("GIL held", "gil", t->t_taken, now, -1);
    t->held_s += now - t->t_taken;
    CHECK_PT(pthread_mutex_lock(&g->mutex));
    ASSERT(g->locked && g->last_holder == t->id); /* releasing a lock we do not hold */
    g->locked = 0;
    CHECK_PT(pthread_cond_signal(&g->cond));
    CHECK_PT(pthread_mutex_unlock(&g->mutex));
    /* Forced switching: dropping while a drop is requested means "let the other thread run" —
     * wait until some other thread has taken the lock, so we cannot take it straight back. */
    if (atomic_load(&g->drop_request)) {
        double t0 = time_now();
        CHECK_PT(pthread_mutex_lock(&g->switch_mutex));
        if (g->last_holder == t->id) {
            atomic_store(&g->drop_request, 0);
            t->forced_drops++;
            g->forced_switches++;
            /* CPython waits once; we loop so that a spurious wake-up cannot end the wait early */
            while (g->last_holder == t->id) CHECK_PT(pthread_cond_wait(&g->switch_cond, &g->switch_mutex));
        }
        CHECK_PT(pthread_mutex_unlock(&g->switch_mutex));
        double t1 = time_now();
        trace_complete("GIL wait (forced switch)", "gil", t0, t1, -1);
        t->waited_s += t1 - t0;
    }
}

void gil_check(Gil *g, GilThread *t) {
    if (!atomic_load_explicit(&g->drop_request, memory_order_relaxed)) return;
    gil_release(g, t);
    gil_acquire(g, t);
}

void gil_hold_for(Gil *g, GilThread *t, double us) {
    double left = us * 1e-6, last = time_now();
    while (left > 0) {
        /* one "bytecode" at a time: the eval loop looks at the drop request between them */
        if (atomic_load_explicit(&g->drop_request, memory_order_relaxed)) {
            gil_check(g, t);
            last = time_now(); /* time switched out is not interpreter time */
            continue;
        }
        double now = time_now();
        left -= now - last;
        last = now;
    }
}
