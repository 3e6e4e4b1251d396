/* test_gil.c — the GIL model (common/gil.h) behaves as CPython's: mutual exclusion, drop requests
 * after one switch interval, forced switching, and honest statistics. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "gil.h"
#include "tests.h"

/* ---- mutual exclusion under contention ----------------------------------------------------- */

typedef struct Contender {
    Gil *g;
    GilThread t;
    int iters;
    int *counter;      /* incremented non-atomically, with a yield in the middle: races would show */
    atomic_int *bad;   /* times a thread saw the lock held by someone else while it thought it held it */
} Contender;

static void *contend(void *arg) {
    Contender *c = arg;
    gil_thread_start(c->g, &c->t);
    for (int i = 0; i < c->iters; i++) {
        gil_acquire(c->g, &c->t);
        if (gil_holder(c->g) != c->t.id) atomic_fetch_add(c->bad, 1);
        int v = *c->counter;
        if (i % 7 == 0) sched_yield();
        *c->counter = v + 1;
        if (i % 5 == 0) gil_hold_for(c->g, &c->t, 20); /* may switch out on a drop request */
        if (gil_holder(c->g) != c->t.id) atomic_fetch_add(c->bad, 1);
        gil_release(c->g, &c->t);
    }
    return NULL;
}

START_TEST(gil_mutual_exclusion_under_contention) {
    Gil g;
    gil_init(&g, 0.05); /* a short interval, so drop requests and forced switches happen too */
    enum { T = 4, ITERS = 3000 };
    Contender c[T];
    pthread_t th[T];
    int counter = 0;
    atomic_int bad = 0;
    for (int i = 0; i < T; i++) {
        c[i] = (Contender){.g = &g, .iters = ITERS, .counter = &counter, .bad = &bad};
        gil_thread_init(&c[i].t, "contender");
        ck_assert_int_eq(pthread_create(&th[i], NULL, contend, &c[i]), 0);
    }
    for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
    ck_assert_int_eq(atomic_load(&bad), 0);
    ck_assert_int_eq(counter, T * ITERS);
    ck_assert_uint_eq(gil_holder(&g), 0);
    int64_t acquires = 0;
    for (int i = 0; i < T; i++) acquires += c[i].t.acquires;
    ck_assert_int_ge(acquires, T * ITERS); /* forced switches inside hold_for re-acquire: ≥ */
    ck_assert_int_gt(g.handoffs, 0);
    gil_destroy(&g);
}
END_TEST

/* ---- a holder that never lets go voluntarily ----------------------------------------------- */

typedef struct Spinner {
    Gil *g;
    GilThread t;
    double hold_us;
    atomic_int holding, done;
} Spinner;

/* Takes the lock and runs `hold_us` of "bytecode" without ever releasing it voluntarily. */
static void *spin_holder(void *arg) {
    Spinner *s = arg;
    gil_thread_start(s->g, &s->t);
    gil_acquire(s->g, &s->t);
    atomic_store(&s->holding, 1);
    gil_hold_for(s->g, &s->t, s->hold_us);
    atomic_store(&s->done, 1);
    gil_release(s->g, &s->t);
    return NULL;
}

static void wait_until_holding(Spinner *s) {
    while (!atomic_load(&s->holding)) sched_yield();
}

/* A spinner thread holding the GIL (returns once it does), and a waiter — this thread — about to
 * ask for it. */
static void start_spinner(Spinner *s, pthread_t *th) {
    gil_thread_init(&s->t, "spinner");
    ck_assert_int_eq(pthread_create(th, NULL, spin_holder, s), 0);
    wait_until_holding(s);
}
static void start_waiter(Gil *g, GilThread *me) {
    gil_thread_init(me, "waiter");
    gil_thread_start(g, me);
}

START_TEST(gil_waiter_gets_lock_within_one_switch_interval) {
    const double interval_ms = 10;
    Gil g;
    gil_init(&g, interval_ms);
    Spinner s = {.g = &g, .hold_us = 400e3};
    pthread_t th;
    start_spinner(&s, &th);
    GilThread me;
    start_waiter(&g, &me);
    double t0 = time_now();
    gil_acquire(&g, &me);
    double waited_ms = 1e3 * (time_now() - t0);
    int spinner_done = atomic_load(&s.done);
    gil_release(&g, &me);
    pthread_join(th, NULL);
    /* one timed wait of the interval, then the drop request is honoured within microseconds; the
     * upper bound leaves room for a loaded CI machine */
    ck_assert_msg(waited_ms >= 0.9 * interval_ms && waited_ms < 4 * interval_ms * test_time_scale(),
                  "waited %.2f ms for a %.0f ms switch interval", waited_ms, interval_ms);
    ck_assert_msg(!spinner_done, "the waiter only got the lock after the holder finished");
    ck_assert_int_eq(me.drop_requests, 1);
    /* ≤: when the waiter takes the lock (clearing the request) before the dropper looks at it, the
     * dropper has nothing left to wait for — CPython has the same benign race */
    ck_assert_int_le(s.t.forced_drops, 1);
    ck_assert_int_le(g.forced_switches, 1);
    gil_destroy(&g);
}
END_TEST

/* A forced drop hands the lock to the waiter: the dropping thread, although it asks for the lock
 * again at once, gets it only after the waiter has had it. */
START_TEST(gil_forced_switch_dropper_does_not_reacquire_first) {
    Gil g;
    gil_init(&g, 2);
    int64_t forced = 0;
    /* Whether the dropper itself waits is a race (see above): repeat a few rounds so the wait
     * usually runs, but the property asserted is the order, which holds either way. */
    for (int round = 0; round < 5 || (forced == 0 && round < 20); round++) {
        Spinner s = {.g = &g, .hold_us = 60e3};
        pthread_t th;
        start_spinner(&s, &th);
        GilThread me;
        start_waiter(&g, &me);
        gil_acquire(&g, &me);
        /* the spinner dropped mid-hold and has not had the lock back since */
        ck_assert_int_eq(atomic_load(&s.done), 0);
        ck_assert_int_eq(s.t.acquires, 1);
        /* hold it a while: the spinner, which asked for it back immediately, must keep waiting */
        double t0 = time_now();
        while (time_now() - t0 < 1e-3) ;
        ck_assert_int_eq(s.t.acquires, 1);
        gil_release(&g, &me);
        pthread_join(th, NULL);
        ck_assert_int_eq(s.t.acquires, 2); /* it came back after us, and finished its 60 ms */
        ck_assert(s.t.held_s >= 0.059);
        ck_assert_int_le(s.t.forced_drops, 1);
        /* on a loaded machine the waiter may be asked to drop too (the spinner's timed wait for
         * the lock back can expire while we hold it), so count both threads' forced drops */
        forced += s.t.forced_drops + me.forced_drops;
    }
    /* every forced wait that ran is counted once, in the thread and in the lock (on a loaded
     * machine the waiter can win every race, so none may have run: not a failure) */
    if (forced == 0) printf("note: gil: the forced-switch wait lost every race this run (machine busy)\n");
    ck_assert_int_eq(g.forced_switches, forced);
    gil_destroy(&g);
}
END_TEST

/* The other half of the drop-request rule: a waiter whose timed wait expires after the lock
 * changed hands does not ask the new holder to drop — it waits one more interval, so a thread that
 * just got the lock keeps it for a whole interval. Two waiters (b, c), one voluntary release by a:
 * the release wakes one of them (the winner), which takes the lock and holds it; the other (the
 * loser) saw that switch during its first wait, so only its second timeout may ask for the lock. */
typedef struct Racer {
    Gil *g;
    GilThread t;
    atomic_int *order; /* how many racers have had the lock so far */
    int place;         /* 0: had it first (the winner) */
    double hold_us;    /* how long the winner holds it */
} Racer;

static void *race(void *arg) {
    Racer *r = arg;
    gil_acquire(r->g, &r->t);
    r->place = atomic_fetch_add(r->order, 1);
    if (r->place == 0) gil_hold_for(r->g, &r->t, r->hold_us);
    gil_release(r->g, &r->t);
    return NULL;
}

/* One round; 0 when a waiter timed out before the switch (a busy machine), so the rule was not
 * exercised and the round says nothing. */
static int switch_round(void) {
    const double interval_ms = 100;
    Gil g;
    gil_init(&g, interval_ms);
    GilThread a;
    gil_thread_init(&a, "a");
    gil_thread_start(&g, &a);
    gil_acquire(&g, &a);
    atomic_int order = 0;
    Racer r[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (Racer){.g = &g, .order = &order, .hold_us = 6 * interval_ms * 1e3};
        gil_thread_init(&r[i].t, i ? "c" : "b");
        gil_thread_start(&g, &r[i].t);
        ck_assert_int_eq(pthread_create(&th[i], NULL, race, &r[i]), 0);
    }
    double t0 = time_now(); /* both in their first timed wait before the lock changes hands */
    while (gil_waiting(&g) < 2) {
        ck_assert_msg(time_now() - t0 < 5 * test_time_scale(), "the two waiters never blocked on the lock");
        sched_yield();
    }
    gil_release(&g, &a);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    Racer *loser = r[0].place == 1 ? &r[0] : &r[1], *winner = loser == r ? &r[1] : &r[0];
    ck_assert_int_eq(winner->place + loser->place, 1);
    if (a.forced_drops) { /* a waiter's first wait ran out before both were waiting: another test */
        gil_destroy(&g);
        return 0;
    }
    /* The loser's first timeout came after the switch: no request. Its second asked the winner to
     * drop (once), and it got the lock then — two intervals after it began to wait, not one (the
     * rule broken), nor at the end of the winner's six (never asking). */
    double waited_ms = 1e3 * loser->t.waited_s;
    ck_assert_msg(waited_ms >= 1.5 * interval_ms && waited_ms < 4 * interval_ms * test_time_scale(),
                  "the waiter that saw the lock change hands waited %.1f ms for it (two %.0f ms intervals expected)",
                  waited_ms, interval_ms);
    ck_assert_int_eq(loser->t.drop_requests, 1);
    ck_assert_int_eq(winner->t.drop_requests, 0);
    /* the winner dropped the lock for it once and took it back; whether it had to wait for the
     * switch is the race test above describes */
    ck_assert_int_eq(winner->t.acquires, 2);
    ck_assert_int_le(winner->t.forced_drops, 1);
    gil_destroy(&g);
    return 1;
}

START_TEST(gil_no_drop_request_after_a_switch_during_the_wait) {
    /* a busy machine can delay a waiter past its first interval before the switch: another round
     * then, and a failure only if none of five exercised the rule (it would otherwise pass unchecked) */
    int round = 0;
    while (!switch_round())
        ck_assert_msg(++round < 5, "gil: in 5 rounds a waiter always timed out before the switch (machine too "
                      "busy?): the rule was never exercised");
}
END_TEST

/* Voluntary release just signals: with no drop request pending, the releaser does not wait. */
START_TEST(gil_voluntary_release_does_not_wait) {
    Gil g;
    gil_init(&g, 5);
    GilThread a;
    gil_thread_init(&a, "a");
    gil_thread_start(&g, &a);
    double t0 = time_now();
    for (int i = 0; i < 1000; i++) {
        gil_acquire(&g, &a);
        gil_release(&g, &a);
    }
    ck_assert_msg(time_now() - t0 < 0.5 * test_time_scale(), "1000 uncontended acquire/release took %.3f s", time_now() - t0);
    ck_assert_int_eq(a.forced_drops, 0);
    ck_assert_int_eq(g.handoffs, 0);
    gil_destroy(&g);
}
END_TEST

/* Whoever takes the lock clears a pending drop request (CPython's take_gil: RESET_GIL_DROP_REQUEST).
 * A request left over from before — its waiter got the lock through another hand-off, or its target
 * released first — was meant for the last holder, not the new one: kept, it would make the new holder
 * drop at its first check and wait for a switch, a forced switch nobody asked of it. */
START_TEST(gil_acquire_clears_a_stale_drop_request) {
    Gil g;
    gil_init(&g, 5);
    GilThread a;
    gil_thread_init(&a, "a");
    gil_thread_start(&g, &a);
    atomic_store(&g.drop_request, 1); /* as a waiter's timed-out wait leaves it */
    gil_acquire(&g, &a);
    ck_assert_msg(atomic_load(&g.drop_request) == 0, "the new holder still sees the old drop request");
    gil_hold_for(&g, &a, 200);
    gil_release(&g, &a);
    ck_assert_int_eq(a.forced_drops, 0);
    ck_assert_int_eq(g.forced_switches, 0);
    ck_assert_int_eq(a.acquires, 1);
    gil_destroy(&g);
}
END_TEST

/* ---- statistics ------------------------------------------------------------------------------ */

typedef struct Holder {
    Gil *g;
    GilThread t;
} Holder;

static void *hold_ten_ms(void *arg) {
    Holder *h = arg;
    gil_thread_start(h->g, &h->t);
    for (int i = 0; i < 10; i++) {
        gil_acquire(h->g, &h->t);
        gil_hold_for(h->g, &h->t, 1000);
        gil_release(h->g, &h->t);
    }
    return NULL;
}

START_TEST(gil_statistics_add_up) {
    Gil g;
    gil_init(&g, 5);
    Holder a = {.g = &g};
    gil_thread_init(&a.t, "a");
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, hold_ten_ms, &a), 0);
    pthread_join(th, NULL);
    ck_assert_str_eq(a.t.name, "a");
    ck_assert_int_eq(a.t.acquires, 10);
    /* at least the 10 × 1 ms charged; the upper bounds only catch gross miscounting (a busy
     * machine may preempt the holder mid-hold) */
    ck_assert_msg(a.t.held_s >= 0.010 && a.t.held_s < 0.5 * test_time_scale(), "held %.4f s", a.t.held_s);
    ck_assert_msg(a.t.waited_s < 0.1 * test_time_scale(), "waited %.4f s for a free lock", a.t.waited_s);
    ck_assert_int_eq(g.handoffs, 0); /* one thread alone: the lock never changes hands */
    /* the same slot taken over by a new thread is a new thread state: a hand-off */
    ck_assert_int_eq(pthread_create(&th, NULL, hold_ten_ms, &a), 0);
    pthread_join(th, NULL);
    ck_assert_int_eq(a.t.acquires, 20);
    ck_assert_int_eq(g.handoffs, 1);
    ck_assert(a.t.held_s >= 0.020);
    /* two threads taking turns: every acquisition after the first is a hand-off */
    Holder b = {.g = &g};
    gil_thread_init(&b.t, "b");
    gil_thread_start(&g, &b.t);
    gil_thread_start(&g, &a.t);
    int64_t h0 = g.handoffs;
    for (int i = 0; i < 6; i++) {
        Holder *h = i % 2 ? &b : &a;
        gil_acquire(&g, &h->t);
        gil_release(&g, &h->t);
    }
    ck_assert_int_eq(g.handoffs - h0, 6);
    ck_assert_int_eq(g.forced_switches, 0);
    gil_destroy(&g);
}
END_TEST

Suite *suite_gil(void) {
    Suite *s = suite_create("gil");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gil_mutual_exclusion_under_contention);
    tcase_add_test(tc, gil_waiter_gets_lock_within_one_switch_interval);
    tcase_add_test(tc, gil_forced_switch_dropper_does_not_reacquire_first);
    tcase_add_test(tc, gil_no_drop_request_after_a_switch_during_the_wait);
    tcase_add_test(tc, gil_voluntary_release_does_not_wait);
    tcase_add_test(tc, gil_acquire_clears_a_stale_drop_request);
    tcase_add_test(tc, gil_statistics_add_up);
    suite_add_tcase(s, tc);
    return s;
}
