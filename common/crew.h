/* crew.h — a crew of persistent worker threads that each do one piece of work per round.
 *
 * The main thread calls crew_run(c, k): workers 0..k−1 each do their piece (a replica's backward,
 * say), workers k and beyond sit the round out, and crew_run returns once all k are done. A worker
 * loops on crew_next (block until there is work for it, or the crew quits) and crew_finish.
 * Stage 2 uses two: PyTorch's autograd device threads, and --dp-thread-pool's forward threads; the
 * CPU backend's intra-op threads are a third (cpu_threads.h). */
#ifndef CREW_H
#define CREW_H

#include <pthread.h>
#include <stdint.h>

typedef struct Crew {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;      /* bumped for every round */
    int k, pending, quit;
} Crew;

void crew_init(Crew *c);
void crew_destroy(Crew *c); /* after crew_quit and joining the workers */
/* Main thread: run a round on workers 0..k−1 and wait until all of them are done. */
void crew_run(Crew *c, int k);
/* crew_run in two halves, so the main thread can do a piece of its own in between. */
void crew_start(Crew *c, int k);
void crew_wait(Crew *c);
/* Worker `index`: block until this round has work for it (returns 1) or the crew quits (0).
 * *seen is the worker's own round counter, starting at 0. */
int crew_next(Crew *c, uint64_t *seen, int index);
/* Worker: this round's piece is done. */
void crew_finish(Crew *c);
/* Main thread: wake every worker to return 0 from crew_next (then join them). */
void crew_quit(Crew *c);

#endif
