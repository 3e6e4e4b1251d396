/* cpu_threads.c — see cpu_threads.h. A Crew (crew.h) of helper threads, started as they are first
 * needed and kept for the life of the process; helper i runs range i + 1 of each job. */
#include "cpu_threads.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "crew.h"
#include "errors.h"

static struct {
    pthread_mutex_t use; /* held for a whole job: one job at a time */
    Crew crew;
    int want;            /* cpu_threads_set's count (atomic: stage 2's replica threads read it) */
    int started;         /* helpers running */
    int sharers;         /* processes sharing this host's cores (cpu_threads_share) */
    CpuRangeFn fn;       /* the job, written under `use` before crew_start */
    void *arg;
    int count, parts;
} pool = {.use = PTHREAD_MUTEX_INITIALIZER, .want = 1, .sharers = 1};

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

/* A forked child (stage 3's launcher forks its workers) has none of the parent's helper threads:
 * start again from an empty pool. */
static void pool_after_fork(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pool.use = fresh;
    crew_init(&pool.crew);
    pool.started = 0;
}

static void pool_init(void) {
    crew_init(&pool.crew);
    CHECK_PT(pthread_atfork(NULL, NULL, pool_after_fork));
}

static void range(int part, int *lo, int *hi) {
    *lo = (int)((int64_t)pool.count * part / pool.parts);
    *hi = (int)((int64_t)pool.count * (part + 1) / pool.parts);
}

static void *helper(void *p) {
    int index = (int)(intptr_t)p;
    uint64_t seen = 0; /* earlier rounds all had fewer helpers than index + 1: it sits them out */
    while (crew_next(&pool.crew, &seen, index)) {
        int lo, hi;
        range(index + 1, &lo, &hi);
        pool.fn(pool.arg, lo, hi);
        crew_finish(&pool.crew);
    }
    return NULL;
}

void cpu_threads_set(int n) {
    if (n < 1 || n > CPU_THREADS_MAX)
        die_user("--cpu-threads %d: give 1 to %d, or leave it out for the automatic count", n, CPU_THREADS_MAX);
    __atomic_store_n(&pool.want, n, __ATOMIC_RELAXED);
}

int cpu_threads_get(void) { return __atomic_load_n(&pool.want, __ATOMIC_RELAXED); }

void cpu_threads_share(int processes) { pool.sharers = processes > 1 ? processes : 1; }

static int warned; /* OMP_NUM_THREADS's warning: said once a process, or left to another (cpu_threads_quiet) */
void cpu_threads_quiet(void) { warned = 1; }

int cpu_threads_auto(int replicas) {
    const char *omp = getenv("OMP_NUM_THREADS");
    char *end;
    long n = omp ? strtol(omp, &end, 10) : 0;
    if (omp && *omp && !*end && n >= 1) {
        if (n > CPU_THREADS_MAX && !warned++)
            fprintf(stderr, "warning: OMP_NUM_THREADS=%s: the CPU backend uses at most %d threads\n", omp,
                    CPU_THREADS_MAX);
        return n < CPU_THREADS_MAX ? (int)n : CPU_THREADS_MAX;
    }
    /* OpenMP runtimes ignore a value they cannot read, with a warning: so do we */
    if (omp && *omp && !warned++)
        fprintf(stderr, "warning: OMP_NUM_THREADS=%s is not a whole number of threads (1 or more): ignored, the "
                        "cores are shared out instead (--cpu-threads N sets the count)\n", omp);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long share = cores / ((long)pool.sharers * (replicas > 1 ? replicas : 1));
    return share < 1 ? 1 : share < CPU_THREADS_MAX ? (int)share : CPU_THREADS_MAX;
}

void cpu_parallel_for(int count, int grain, CpuRangeFn fn, void *arg) {
    int parts = cpu_threads_get();
    if (grain < 1) grain = 1;
    if (parts > count / grain) parts = count / grain;
    if (parts <= 1 || pthread_mutex_trylock(&pool.use) != 0) { /* nothing to share, or the pool is busy */
        if (count > 0) fn(arg, 0, count);
        return;
    }
    CHECK_PT(pthread_once(&pool_once, pool_init));
    for (; pool.started < parts - 1; pool.started++) {
        pthread_t t;
        xthread_create(&t, helper, (void *)(intptr_t)pool.started);
        CHECK_PT(pthread_detach(t));
    }
    pool.fn = fn, pool.arg = arg, pool.count = count, pool.parts = parts;
    crew_start(&pool.crew, parts - 1);
    int lo, hi;
    range(0, &lo, &hi);
    fn(arg, lo, hi);
    crew_wait(&pool.crew);
    CHECK_PT(pthread_mutex_unlock(&pool.use));
}
