/* crew.c — see crew.h. */
#include "crew.h"

#include <string.h>

#include "errors.h"

void crew_init(Crew *c) {
    memset(c, 0, sizeof *c);
    xmutex_init(&c->mu);
    xcond_init(&c->go);
    xcond_init(&c->done);
}

void crew_destroy(Crew *c) {
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->go);
    pthread_cond_destroy(&c->done);
}

void crew_start(Crew *c, int k) {
    CHECK_PT(pthread_mutex_lock(&c->mu));
    c->k = k;
    c->pending = k;
    c->gen++;
    CHECK_PT(pthread_cond_broadcast(&c->go));
    CHECK_PT(pthread_mutex_unlock(&c->mu));
}

void crew_wait(Crew *c) {
    CHECK_PT(pthread_mutex_lock(&c->mu));
    while (c->pending > 0) CHECK_PT(pthread_cond_wait(&c->done, &c->mu));
    CHECK_PT(pthread_mutex_unlock(&c->mu));
}

void crew_run(Crew *c, int k) {
    crew_start(c, k);
    crew_wait(c);
}

int crew_next(Crew *c, uint64_t *seen, int index) {
    int work = 0;
    CHECK_PT(pthread_mutex_lock(&c->mu));
    while (!c->quit && !work) {
        while (c->gen == *seen && !c->quit) CHECK_PT(pthread_cond_wait(&c->go, &c->mu));
        if (c->quit) break;
        *seen = c->gen;
        work = index < c->k; /* workers beyond this round's k sit it out */
    }
    CHECK_PT(pthread_mutex_unlock(&c->mu));
    return work;
}

void crew_finish(Crew *c) {
    CHECK_PT(pthread_mutex_lock(&c->mu));
    if (--c->pending == 0) CHECK_PT(pthread_cond_signal(&c->done));
    CHECK_PT(pthread_mutex_unlock(&c->mu));
}

void crew_quit(Crew *c) {
    CHECK_PT(pthread_mutex_lock(&c->mu));
    c->quit = 1;
    CHECK_PT(pthread_cond_broadcast(&c->go));
    CHECK_PT(pthread_mutex_unlock(&c->mu));
}
