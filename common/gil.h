/* gil.h — a model of CPython's global interpreter lock (the "new GIL" of CPython 3.2+), for stage 2.
 *
 * nn.DataParallel runs one Python thread per GPU, and those threads share one interpreter lock, which
 * serialises their Python (most of stage 2's loss is elsewhere: the per-thread plan caches, its
 * README). Stage 2 reproduces the lock's rules exactly (CPython's Python/ceval_gil.c, take_gil /
 * drop_gil):
 *  - a thread that wants the lock while another holds it does a timed wait of the switch interval
 *    (sys.getswitchinterval(), 5 ms); if it timed out and no switch happened meanwhile, it sets a
 *    *drop request*;
 *  - the holder checks the request between bytecodes (gil_check, and inside gil_hold_for) and drops
 *    the lock;
 *  - forced switching: a thread that drops the lock while a drop request is pending then waits until
 *    another thread has taken it, so it cannot grab it straight back;
 *  - a voluntary release (C code around blocking or GPU work: Py_BEGIN_ALLOW_THREADS) signals one
 *    waiter (and, with a drop request pending, waits for the switch as above); the releasing thread
 *    may well take the lock again before the waiter wakes up, and the waiter then starts a new full
 *    wait — so threads that let go after every op are never asked to drop it, and lose their turns
 *    to wake-up latency instead.
 *
 * What holds the lock is *interpreter time*: gil_hold_for spins (busy-waits) for the given time
 * while holding it, as the interpreter would be executing bytecode. Stage 2 charges the host-side
 * Python of each forward op and of DataParallel's own bookkeeping this way (see common/dp.h).
 *
 * A GilThread is one thread's identity and statistics. CPython gives every new thread a new
 * thread state, so gil_thread_start gives the slot a new identity each time a new OS thread takes it
 * over (stage 2 creates new threads every step); the statistics keep accumulating in the slot. */
#ifndef GIL_H
#define GIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

typedef struct GilThread {
    char name[24];
    uint64_t id;            /* identity of the OS thread now using this slot (0: none yet) */
    double t_taken;         /* when it last took the lock */
    /* statistics, accumulated over every thread that used this slot */
    double held_s;          /* total time holding the lock */
    double waited_s;        /* total time blocked waiting for it */
    int64_t acquires;       /* times it took the lock */
    int64_t drop_requests;  /* times it timed out waiting and asked the holder to drop */
    int64_t forced_drops;   /* times it dropped on request and waited for another thread to take it */
} GilThread;

typedef struct Gil {
    pthread_mutex_t mutex;       /* guards locked, waiting, last_holder, switch_number */
    pthread_cond_t cond;         /* signalled on every release */
    pthread_mutex_t switch_mutex;
    pthread_cond_t switch_cond;  /* signalled when a thread takes the lock (forced switching) */
    double interval_s;           /* the switch interval */
    int locked;
    int waiting;                 /* threads in take_gil's timed wait now (gil_waiting, for tests) */
    uint64_t last_holder;        /* id of the thread that last took the lock */
    uint64_t switch_number;      /* how many times the lock changed hands */
    atomic_int drop_request;     /* CPython's gil_drop_request (eval_breaker bit) */
    uint64_t next_id;
    int64_t handoffs;            /* lock taken by a different thread than its last holder */
    int64_t forced_switches;     /* drops on request that waited for the switch */
} Gil;

/* switch_ms: the switch interval (sys.setswitchinterval(switch_ms / 1000)). */
void gil_init(Gil *g, double switch_ms);
void gil_destroy(Gil *g);

/* Name a statistics slot (zeroed). */
void gil_thread_init(GilThread *t, const char *name);
/* A new OS thread is about to use slot t: give it a fresh identity (CPython: a new thread state). */
void gil_thread_start(Gil *g, GilThread *t);

/* take_gil: block until the lock is ours (timed waits of the switch interval, drop requests). */
void gil_acquire(Gil *g, GilThread *t);
/* drop_gil: release; if a drop was requested, wait until another thread has taken the lock. */
void gil_release(Gil *g, GilThread *t);
/* Between bytecodes: if a drop is requested, drop the lock (forced switch) and take it back. */
void gil_check(Gil *g, GilThread *t);
/* Interpreter time: with the lock held, spin for `us` microseconds of holding it, honouring drop
 * requests as the eval loop does (time spent switched out does not count). */
void gil_hold_for(Gil *g, GilThread *t, double us);

/* The id of the thread holding the lock now, 0 if free (for tests). */
uint64_t gil_holder(Gil *g);
/* How many threads are blocked in gil_acquire's timed wait now (for tests). */
int gil_waiting(Gil *g);

#endif
