/* trace.c — the trace recorder (see trace.h): one preallocated buffer of spans claimed with an atomic
 * index, CUDA event pairs per device resolved when the window closes, the JSON writer and the merge
 * of the ranks' files (each written as NAME.tmp and renamed into place once complete). */
#include "trace.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "device.h"
#include "errors.h"

#define MAX_EVENTS (1 << 17) /* host and CPU-device spans of one window (~6 MiB) */
#define MAX_LANES 256        /* named host threads */
#define MAX_DEVS TRACE_MAX_DEVICES
#define DEV_SPANS 4096       /* CUDA event pairs per device and window */
#define DEV_TID 1000         /* device lanes: tid DEV_TID + 8 × device + lane, after the threads */

atomic_int trace_active_;

typedef struct Event {
    const char *name, *cat;
    int64_t t0, t1, arg; /* ns on the host's monotonic clock */
    int64_t step;        /* a device span's optimizer step (args.step); −1: a host span's, not written */
    int tid;
    atomic_int ready;    /* set last: the writer reads only finished entries */
} Event;

typedef struct DevPool {
    Device *d;
    int64_t ref_ns; /* host time of the reference event */
    atomic_int next, resolved;
#ifdef USE_CUDA
    cudaEvent_t ref, *ev; /* ev[2k], ev[2k+1]: span k's begin and end */
#endif
    struct { const char *name, *cat; int64_t arg, step; int lane; atomic_int ready; } *meta;
} DevPool;

/* A trace file in the making: written under NAME.tmp, next to NAME, and renamed to NAME only once
 * complete, so a run that crashes or is killed (Ctrl-C without --save) leaves the previous NAME as it
 * was. The .tmp file is opened when the trace is configured — an unwritable place fails at start-up,
 * not after training — and kept open until the end. A character device (/dev/null) is written in place. */
typedef struct Out {
    FILE *f;
    char path[4200]; /* NAME, a symlink resolved (the file it points to is replaced, the link kept) */
    char tmp[4208];  /* path + ".tmp"; "" when written in place */
    const char *at;  /* the name being written: tmp, or path */
} Out;

static struct {
    char file[4096];
    int configured, opened, closed, written, rank, world;
    int none;         /* resumed past the window: nothing written, NAME left as it was (trace_finish) */
    Out mine, merged; /* this process's file; rank 0 of several: the merged one */
    int64_t a, b, step_t0, first; /* first: the step the run started at (−1 before any; a resumed run's is past 0) */
    int64_t held_a, held_b;       /* the steps whose spans the trace holds, [held_a, held_b) (held_b ≤ b when
                                     the run stops inside the window; a resumed run's held_a may be past a) */
    char process[64];
    Event *ev;
    atomic_int n;
    atomic_long dropped;
    pthread_mutex_t lane_mu;
    char lanes[MAX_LANES][32];
    int n_lanes;
    DevPool devs[MAX_DEVS];
    int n_devs;
} g = {.lane_mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int my_tid; /* 0: not yet given a lane */

/* The optimizer step running now (steps done so far), which every device span records: on a GPU the
 * spans run after the host's step span has moved on, and a replica with no chunk in a step has no
 * span in it, so only this number pairs one device's step with another's (tests/step_skew.py). */
static _Atomic int64_t cur_step;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time_now()'s clock, in integer ns */
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- flags ------------------------------------------------------------------------------------ */

#define TRACE_MAX_STEP 1000000000000LL /* 10^12 steps: beyond any run, and far from overflow */

void trace_parse_steps(const char *flag, int64_t *a, int64_t *b) {
    char *end;
    const char *colon = strchr(flag, ':');
    long long x = -1, y = -1;
    if (colon && !flag[strspn(flag, "0123456789:")]) { /* digits only: strtoll would also take " 1", "+1" */
        errno = 0;
        x = strtoll(flag, &end, 10);
        if (end != colon || colon == flag) x = -1;
        y = strtoll(colon + 1, &end, 10);
        if (*end || !colon[1]) y = -1;
        if (errno == ERANGE || x > TRACE_MAX_STEP || y > TRACE_MAX_STEP)
            die_user("--trace-steps %s: out of range — A and B are optimizer steps, at most %lld, e.g. "
                     "--trace-steps %s", flag, (long long)TRACE_MAX_STEP, TRACE_DEFAULT_STEPS);
    }
    if (!colon || x < 0 || y < 0)
        die_user("--trace-steps %s: expected A:B, the optimizer steps A (first, counted from 0) to B "
                 "(excluded), e.g. --trace-steps %s", flag, TRACE_DEFAULT_STEPS);
    if (y <= x) die_user("--trace-steps %s: the window is empty — B must be greater than A (e.g. %lld:%lld)", flag, x, x + 3);
    if (y - x > 1000)
        die_user("--trace-steps %s: %lld steps is too many for one trace file — trace at most 1000 steps "
                 "(a few are enough to see the pattern)", flag, y - x);
    *a = x, *b = y;
}

/* ---- lanes ------------------------------------------------------------------------------------ */

static int lane_of(const char *name) { /* under lane_mu */
    for (int i = 0; i < g.n_lanes; i++)
        if (!strcmp(g.lanes[i], name)) return i + 1;
    if (g.n_lanes == MAX_LANES) return MAX_LANES; /* the last lane takes every extra thread */
    snprintf(g.lanes[g.n_lanes], sizeof g.lanes[0], "%s", name);
    return ++g.n_lanes;
}

/* Threads are often started before the run configures the trace (loader workers, DataParallel's
 * and the communicator's threads): the name is kept with the thread, and its lane is taken (under a
 * lock, once per thread) when it first records. */
static _Thread_local char my_name[32];

void trace_thread_name(const char *name) {
    snprintf(my_name, sizeof my_name, "%s", name);
    my_tid = 0;
}

static int tid_self(void) {
    if (!my_tid) {
        pthread_mutex_lock(&g.lane_mu);
        if (!my_name[0]) snprintf(my_name, sizeof my_name, "thread %d", g.n_lanes + 1); /* nobody named it */
        my_tid = lane_of(my_name);
        pthread_mutex_unlock(&g.lane_mu);
    }
    return my_tid;
}

/* ---- recording -------------------------------------------------------------------------------- */

static void emit(const char *name, const char *cat, int64_t t0, int64_t t1, int64_t arg, int64_t step, int tid) {
    int i = atomic_fetch_add_explicit(&g.n, 1, memory_order_relaxed);
    if (i >= MAX_EVENTS) {
        atomic_fetch_add(&g.dropped, 1);
        return;
    }
    Event *e = &g.ev[i];
    e->name = name, e->cat = cat, e->t0 = t0, e->t1 = t1 < t0 ? t0 : t1, e->arg = arg, e->step = step, e->tid = tid;
    atomic_store_explicit(&e->ready, 1, memory_order_release);
}

TraceSpan trace_begin_(const char *name, const char *cat, int64_t arg) {
    return (TraceSpan){.name = name, .cat = cat, .t0 = now_ns(), .arg = arg};
}

void trace_end_(TraceSpan s) { emit(s.name, s.cat, s.t0, now_ns(), s.arg, -1, tid_self()); }

void trace_complete_(const char *name, const char *cat, double t0, double t1, int64_t arg) {
    emit(name, cat, (int64_t)(t0 * 1e9 + 0.5), (int64_t)(t1 * 1e9 + 0.5), arg, -1, tid_self());
}

static int dev_number(const Device *d) {
    for (int i = 0; i < g.n_devs; i++)
        if (g.devs[i].d == d) return i;
    return -1;
}

static int dev_tid(int dev, int lane) { return DEV_TID + 8 * dev + lane; }

TraceDev trace_dev_begin_(Device *d, TraceLane lane, void *stream, const char *name, const char *cat,
                          int64_t arg) {
    TraceDev s = {.slot = -1, .dev = dev_number(d), .name = name, .cat = cat, .arg = arg,
                  .step = atomic_load_explicit(&cur_step, memory_order_relaxed)};
    if (s.dev < 0) return s; /* a device the run did not register (a test's scratch device) */
    if (d->kind == DEV_CPU) {
        s.t0 = now_ns(), s.slot = lane;
        return s;
    }
#ifdef USE_CUDA
    DevPool *p = &g.devs[s.dev];
    int k = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
    if (k >= DEV_SPANS) {
        atomic_fetch_add(&g.dropped, 1);
        s.dev = -1;
        return s;
    }
    cudaStream_t st = stream ? (cudaStream_t)stream : lane == TRACE_COPY ? d->copy_stream : d->stream;
    CHECK_CUDA(cudaEventRecord(p->ev[2 * k], st));
    p->meta[k].name = name, p->meta[k].cat = cat, p->meta[k].arg = arg, p->meta[k].step = s.step;
    p->meta[k].lane = lane;
    s.slot = k, s.stream = (void *)st;
#else
    (void)stream;
#endif
    return s;
}

void trace_dev_end_(TraceDev s) {
    DevPool *p = &g.devs[s.dev];
    if (p->d->kind == DEV_CPU) {
        emit(s.name, s.cat, s.t0, now_ns(), s.arg, s.step, dev_tid(s.dev, s.slot));
        return;
    }
#ifdef USE_CUDA
    if (atomic_load(&p->resolved)) return; /* ended after the window was written */
    CHECK_CUDA(cudaEventRecord(p->ev[2 * s.slot + 1], (cudaStream_t)s.stream));
    atomic_store_explicit(&p->meta[s.slot].ready, 1, memory_order_release);
#endif
}

/* ---- the files -------------------------------------------------------------------------------- */

static const char TRACE_BUSY[] = "another run is writing it now"; /* open_out's why for a file locked */

/* path opened for writing (emptied when `truncate`), or NULL with *why saying what is wrong. Never
 * blocks: a FIFO without a reader would wait forever (so O_NONBLOCK), and one with a reader is refused
 * like any other non-file (a character device, /dev/null say, is fine). */
static FILE *open_out(const char *path, int truncate, const char **why) {
    int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0644);
    struct stat st;
    if (fd < 0) {
        /* ENXIO: a FIFO without a reader — or a socket, or a device with nothing behind it (/dev/tty
         * in a run without a terminal), which errno's own words describe */
        const int e = errno, fifo = e == ENXIO && stat(path, &st) == 0 && S_ISFIFO(st.st_mode);
        errno = e;
        *why = fifo ? "it is a FIFO" : errno_string();
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISCHR(st.st_mode))) {
        *why = S_ISFIFO(st.st_mode) ? "it is a FIFO" : "it is not a regular file";
        close(fd);
        return NULL;
    }
    /* one run writes a trace file at a time (two would share NAME.tmp, and one rename would take the
     * other's file away): a lock held until this process ends, taken before emptying it */
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (S_ISREG(st.st_mode) && fcntl(fd, F_OFD_SETLK, &lk) != 0 && (errno == EAGAIN || errno == EACCES)) {
        *why = TRACE_BUSY;
        close(fd);
        return NULL;
    }
    FILE *f = NULL;
    if ((!truncate || !S_ISREG(st.st_mode) || ftruncate(fd, 0) == 0) &&
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0)
        f = fdopen(fd, "w");
    if (!f) {
        *why = errno_string();
        close(fd);
    }
    return f;
}

/* o's names for `name` (o->at: the one to open): 1, or 0 with *why when the file is there and this
 * user may not write it. */
static int out_names(Out *o, const char *name, const char **why) {
    struct stat st;
    char *real = realpath(name, NULL);
    snprintf(o->path, sizeof o->path, "%s", real ? real : name);
    free(real);
    int exists = stat(o->path, &st) == 0;
    o->tmp[0] = 0, o->at = o->path;
    if (exists && S_ISREG(st.st_mode) && access(o->path, W_OK) != 0) { /* replacing it would bypass that */
        *why = errno_string();
        return 0;
    }
    if (!exists || S_ISREG(st.st_mode)) { /* else a device, or what open_out refuses (a FIFO, a directory) */
        snprintf(o->tmp, sizeof o->tmp, "%s.tmp", o->path);
        o->at = o->tmp;
    }
    return 1;
}

/* 1, or 0 with *why (o->at: the name that failed). */
static int out_open(Out *o, const char *name, const char **why) {
    return out_names(o, name, why) && (o->f = open_out(o->at, 1, why)) != NULL;
}

/* Flush, sync and rename into place: 0, or 1 when writing failed (the partial .tmp file removed), 2
 * when only the rename failed (the complete .tmp file kept), with *why. A write that fails is the
 * machine's state — a full disk, ulimit -f — and exits 1, as --save and --report do (WRITE_FIX); a
 * name that cannot take the file is the user's to change (exit 2). */
#define WRITE_FIX "check free space (df -h) and the file-size limit (ulimit -f)"
static int out_commit(Out *o, const char **why) {
    int bad = fflush(o->f) != 0 || (o->tmp[0] && fsync(fileno(o->f)) != 0);
    if (bad) *why = errno_string();
    if (fclose(o->f) != 0 && !bad) bad = 1, *why = errno_string();
    o->f = NULL;
    if (bad && o->tmp[0]) unlink(o->tmp);
    if (bad) return 1;
    if (o->tmp[0] && rename(o->tmp, o->path) != 0) {
        *why = errno_string();
        return 2;
    }
    return 0;
}

/* ---- the window ------------------------------------------------------------------------------- */

/* Where rank writes its own trace: FILE itself for a run of one process. */
static void rank_path(char *path, size_t size, const char *file, int rank, int world) {
    if (world > 1) snprintf(path, size, "%s.rank%d.json", file, rank);
    else snprintf(path, size, "%s", file);
}

/* o could not be opened (why): the user's error, naming the file. */
static _Noreturn void refuse_out(const char *file, const Out *o, int merged, const char *why) {
    if (why == TRACE_BUSY)
        die_user("--trace %s: another run is writing %s (it holds the file's lock) — give this run another "
                 "--trace file, or wait for that one to end", file, o->at);
    die_if_others_file("--trace", o->at); /* the trace, or its .tmp */
    die_user("--trace %s: cannot write %s%s (%s) — give --trace a regular file in an existing, writable "
             "directory", file, o->at, merged ? ", where the ranks' files are merged" : "", why);
}

void trace_check_free(const char *file, int first, int n, int world) {
    if (!file || !file[0]) return;
    char path[4200];
    const char *why;
    for (int rank = first; rank < first + n; rank++)
        for (int merged = 0; merged < 1 + (world > 1 && rank == 0); merged++) {
            Out o;
            rank_path(path, sizeof path, file, rank, world);
            if (!out_names(&o, merged ? file : path, &why)) refuse_out(file, &o, merged, why);
            die_if_others_file("--trace", o.at);
            if (file_locked_by_another(o.at)) refuse_out(file, &o, merged, TRACE_BUSY);
        }
}

void trace_configure(const char *file, const char *steps, int rank, int world, const char *process,
                     Device **devs, int n_devs) {
    if (!file || !file[0]) return;
    trace_parse_steps(steps, &g.a, &g.b);
    snprintf(g.file, sizeof g.file, "%s", file);
    g.rank = rank, g.world = world;
    snprintf(g.process, sizeof g.process, "%s", process);
    /* fail now, not after the run, when a file cannot be written: this rank's, and the one rank 0
     * merges them into (each as NAME.tmp, open until the end: see Out) */
    char path[4200];
    const char *why;
    rank_path(path, sizeof path, g.file, rank, world);
    for (int merged = 0; merged < 1 + (world > 1 && rank == 0); merged++) {
        Out *o = merged ? &g.merged : &g.mine;
        if (!out_open(o, merged ? g.file : path, &why)) refuse_out(file, o, merged, why);
    }
    g.ev = xcalloc(MAX_EVENTS, sizeof *g.ev);
    g.configured = 1, g.first = -1, g.held_a = g.held_b = -1;
    trace_thread_name(world > 1 ? "main (rank's loop)" : "main (training loop)");
    for (int i = 0; i < n_devs && g.n_devs < MAX_DEVS; i++) {
        DevPool *p = &g.devs[g.n_devs++];
        p->d = devs[i];
        p->meta = xcalloc(DEV_SPANS, sizeof *p->meta);
#ifdef USE_CUDA
        if (devs[i]->kind == DEV_CUDA) { /* every event now, none in the window */
            device_bind(devs[i]);
            p->ev = xcalloc(2 * DEV_SPANS, sizeof *p->ev);
            CHECK_CUDA(cudaEventCreate(&p->ref));
            for (int k = 0; k < 2 * DEV_SPANS; k++) CHECK_CUDA(cudaEventCreate(&p->ev[k]));
        }
#endif
    }
#ifdef USE_CUDA
    if (n_devs > 0 && devs[0]->kind == DEV_CUDA) device_bind(devs[0]);
#endif
}

static void open_window(void) {
    g.opened = 1;
#ifdef USE_CUDA
    /* The one synchronisation: each device's reference event, and the host clock when it is reached. */
    for (int i = 0; i < g.n_devs; i++) {
        DevPool *p = &g.devs[i];
        if (p->d->kind != DEV_CUDA) continue;
        device_bind(p->d);
        CHECK_CUDA(cudaEventRecord(p->ref, p->d->stream));
        CHECK_CUDA(cudaEventSynchronize(p->ref));
        p->ref_ns = now_ns();
    }
    if (g.n_devs > 0 && g.devs[0].d->kind == DEV_CUDA) device_bind(g.devs[0].d);
#endif
    atomic_store(&trace_active_, 1);
}

static void resolve_devices(void) {
#ifdef USE_CUDA
    for (int i = 0; i < g.n_devs; i++) {
        DevPool *p = &g.devs[i];
        if (p->d->kind != DEV_CUDA || atomic_load(&p->resolved)) continue;
        atomic_store(&p->resolved, 1);
        int n = atomic_load(&p->next);
        if (n > DEV_SPANS) n = DEV_SPANS;
        for (int k = 0; k < n; k++) {
            if (!atomic_load_explicit(&p->meta[k].ready, memory_order_acquire)) continue;
            float ms0, ms1;
            CHECK_CUDA(cudaEventSynchronize(p->ev[2 * k + 1]));
            CHECK_CUDA(cudaEventElapsedTime(&ms0, p->ref, p->ev[2 * k]));
            CHECK_CUDA(cudaEventElapsedTime(&ms1, p->ref, p->ev[2 * k + 1]));
            emit(p->meta[k].name, p->meta[k].cat, p->ref_ns + (int64_t)(ms0 * 1e6),
                 p->ref_ns + (int64_t)(ms1 * 1e6), p->meta[k].arg, p->meta[k].step, dev_tid(i, p->meta[k].lane));
        }
    }
#endif
}

static const char *lane_label(int lane) {
    return lane == TRACE_COMPUTE ? "compute" : lane == TRACE_COPY ? "copy" : "comm";
}

/* Lanes top to bottom: the loop, the replica and autograd threads, communication, the loaders. */
static int lane_order(const char *name) {
    static const char *order[] = {"main", "replica", "autograd", "comm", "loader", "eval"};
    int k = 0, n = 0;
    while (k < 6 && strncmp(name, order[k], strlen(order[k]))) k++;
    const char *digits = name + strcspn(name, "0123456789");
    if (*digits) n = atoi(digits);
    return 100 * (k + 1) + (n < 99 ? n : 99);
}

/* " — the run ended after N steps, inside --trace-steps A:B", or "" (a static buffer). */
static const char *held_note(void) {
    static char note[160];
    note[0] = 0;
    if (g.held_b >= 0 && g.held_b < g.b)
        snprintf(note, sizeof note, " — the run ended after %lld step%s, inside --trace-steps %lld:%lld",
                 (long long)g.held_b, g.held_b == 1 ? "" : "s", (long long)g.a, (long long)g.b);
    return note;
}

/* "steps A–B" of the window held, or "step A" when it held one (a static buffer). */
static const char *held_steps(void) {
    static char s[64];
    if (g.held_b - 1 == g.held_a) snprintf(s, sizeof s, "step %lld", (long long)g.held_a);
    else snprintf(s, sizeof s, "steps %lld–%lld", (long long)g.held_a, (long long)g.held_b - 1);
    return s;
}

/* One event per line, lines starting with {"ph": — trace_merge relies on it. */
static void write_file(void) {
    char path[4200];
    if (g.world > 1) snprintf(path, sizeof path, "%s.rank%d.json", g.file, g.rank);
    else snprintf(path, sizeof path, "%s", g.file);
    const char *why;
    FILE *f = g.mine.f;
    int pid = g.rank;
    fprintf(f, "{\"traceEvents\":[\n");
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"%s\"}}", pid,
            g.process);
    fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}}",
            pid, pid);
    pthread_mutex_lock(&g.lane_mu);
    for (int i = 0; i < g.n_lanes; i++) {
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}", pid,
                i + 1, g.lanes[i]);
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                pid, i + 1, lane_order(g.lanes[i]));
    }
    pthread_mutex_unlock(&g.lane_mu);
    int n = atomic_load(&g.n);
    if (n > MAX_EVENTS) n = MAX_EVENTS;
    int used[MAX_DEVS][TRACE_LANES] = {{0}};
    for (int i = 0; i < n; i++)
        if (atomic_load(&g.ev[i].ready) && g.ev[i].tid >= DEV_TID)
            used[(g.ev[i].tid - DEV_TID) / 8][(g.ev[i].tid - DEV_TID) % 8] = 1;
    for (int d = 0; d < g.n_devs; d++)
        for (int l = 0; l < TRACE_LANES; l++) {
            if (!used[d][l]) continue;
            const Device *dev = g.devs[d].d;
            char label[96];
            if (dev->kind == DEV_CUDA) snprintf(label, sizeof label, "GPU%d %s stream", dev->index, lane_label(l));
            else snprintf(label, sizeof label, "cpu dev%d %s (wall clock)", dev->index, lane_label(l));
            fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                    pid, dev_tid(d, l), label);
            fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                    pid, dev_tid(d, l), dev_tid(d, l));
        }
    int spans = 0;
    for (int i = 0; i < n; i++) {
        const Event *e = &g.ev[i];
        if (!atomic_load_explicit(&e->ready, memory_order_acquire)) continue;
        /* integer ns → µs with 3 decimals: exact, so a child never ends past its parent */
        int64_t d = e->t1 - e->t0;
        fprintf(f, ",\n{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%lld.%03lld,"
                   "\"dur\":%lld.%03lld",
                e->name, e->cat, pid, e->tid, (long long)(e->t0 / 1000), (long long)(e->t0 % 1000),
                (long long)(d / 1000), (long long)(d % 1000));
        if (e->arg >= 0 && e->step >= 0)
            fprintf(f, ",\"args\":{\"n\":%lld,\"step\":%lld}", (long long)e->arg, (long long)e->step);
        else if (e->arg >= 0) fprintf(f, ",\"args\":{\"n\":%lld}", (long long)e->arg);
        else if (e->step >= 0) fprintf(f, ",\"args\":{\"step\":%lld}", (long long)e->step);
        fprintf(f, "}");
        spans++;
    }
    fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"trace_steps\":\"%lld:%lld\",\"dropped\":%ld}}\n",
            (long long)g.a, (long long)g.b, atomic_load(&g.dropped));
    int failed = out_commit(&g.mine, &why);
    if (failed == 1) /* no temporary file when writing to a device (/dev/stdout) */
        die_runtime("--trace %s: writing %s failed (%s): " WRITE_FIX, g.file, g.mine.at, why);
    if (failed)
        die_user("--trace %s: cannot replace %s with the finished trace (%s) — it is kept in %s: move it "
                 "where you want it; next time give --trace a regular file", g.file, g.mine.path, why, g.mine.tmp);
    long dropped = atomic_load(&g.dropped);
    if (g.rank == 0 && g.world <= 1 && g.held_a >= 0)
        printf("trace: %d spans of %s in %s (open it in Perfetto or chrome://tracing; make timeline TRACE=%s "
               "draws it)%s\n", spans, held_steps(), path, path, held_note());
    if (dropped) printf("trace: rank %d: %ld spans dropped (the buffer is full): trace fewer steps\n", g.rank, dropped);
}

static void close_window(void) {
    atomic_store(&trace_active_, 0);
    g.closed = 1;
    resolve_devices();
    write_file();
    g.written = 1;
}

void trace_step(int64_t done) {
    if (!g.configured) return;
    atomic_store_explicit(&cur_step, done, memory_order_relaxed);
    if (g.first < 0) g.first = done;
    int64_t now = now_ns();
    if (trace_on()) {
        emit("step", "step", g.step_t0, now, done - 1, -1, tid_self());
        if (g.held_a < 0) g.held_a = done - 1;
        g.held_b = done;
    }
    if (!g.opened && done >= g.a && done < g.b) open_window();
    else if (trace_on() && done >= g.b) close_window();
    g.step_t0 = now_ns();
}

/* An Out not to be written after all: closed, its temporary file removed — NAME is untouched. */
static void out_discard(Out *o) {
    if (!o->f) return;
    fclose(o->f);
    o->f = NULL;
    if (o->tmp[0]) unlink(o->tmp);
}

void trace_finish(void) {
    if (!g.configured || g.written) return;
    if (g.held_a < 0 && g.first >= g.b) {
        /* Resumed past the window (every rank alike: they resume at one step): an empty trace would
         * replace the one the run before the stop wrote — "add --resume to the same command" keeps
         * --trace — so nothing is written, and NAME stays as it was. */
        if (g.rank == 0)
            printf("trace: the run started at step %lld, after the --trace-steps %lld:%lld window: it traced "
                   "nothing and writes no trace (%s, if there, is left as it was)\n", (long long)g.first,
                   (long long)g.a, (long long)g.b, g.file);
        atomic_store(&trace_active_, 0);
        out_discard(&g.mine);
        out_discard(&g.merged);
        g.none = g.written = 1;
        return;
    }
    if (g.held_a < 0 && g.rank == 0) /* ended first, also right as the window opened (--steps A) */
        printf("trace: the run ended before step %lld, where --trace-steps %lld:%lld begins: the trace "
               "holds no spans\n", (long long)g.a, (long long)g.a, (long long)g.b);
    if (g.held_a < 0) { /* the window opened as the run ended (--steps A): what came after, the final
                           evaluation's all-reduces, belongs to no step of it — the trace holds none */
        atomic_store(&trace_active_, 0);
        atomic_store(&g.n, 0);
        for (int i = 0; i < g.n_devs; i++) atomic_store(&g.devs[i].next, 0);
    }
    close_window();
}

int trace_pause(void) {
    int was = trace_on();
    atomic_store(&trace_active_, 0);
    return was;
}

void trace_resume(int was_on) {
    if (!was_on || g.closed) return;
    g.step_t0 = now_ns(); /* the next step span starts after the evaluation */
    atomic_store(&trace_active_, 1);
}

int trace_wants_merge(void) { return g.configured && g.world > 1 && !g.none; }

int trace_rank_file_seen(int r) {
    char path[4300];
    struct stat st;
    snprintf(path, sizeof path, "%s.rank%d.json.tmp", g.file, r); /* this run's, not a stale NAME.rankR.json */
    return stat(path, &st) == 0;
}

void trace_merge(void) {
    if (!trace_wants_merge() || g.rank != 0) return;
    const char *why;
    FILE *out = g.merged.f;
    fprintf(out, "{\"traceEvents\":[");
    int first = 1, spans = 0;
    long dropped = 0; /* the ranks' otherData.dropped, summed: trace_check.py reads it off the merged file */
    char *line = NULL;
    size_t cap = 0;
    for (int r = 0; r < g.world; r++) {
        char path[4200];
        snprintf(path, sizeof path, "%s.rank%d.json", g.file, r);
        FILE *f = fopen(path, "r");
        if (!f) {
            if (g.merged.tmp[0]) unlink(g.merged.tmp);
            die_runtime("trace: rank %d's file %s is missing: cannot merge", r, path);
        }
        ssize_t len;
        while ((len = getline(&line, &cap, f)) > 0) {
            const char *d = strstr(line, "\"otherData\":");
            if (d && (d = strstr(d, "\"dropped\":"))) dropped += strtol(d + 10, NULL, 10);
            if (strncmp(line, "{\"ph\":", 6)) continue;
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == ',')) line[--len] = 0;
            fprintf(out, "%s\n%s", first ? "" : ",", line);
            first = 0;
            spans += strstr(line, "\"ph\":\"X\"") != NULL;
        }
        fclose(f);
    }
    free(line);
    fprintf(out, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"trace_steps\":\"%lld:%lld\",\"ranks\":%d,"
                 "\"dropped\":%ld}}\n", (long long)g.a, (long long)g.b, g.world, dropped);
    int failed = out_commit(&g.merged, &why);
    /* the rank files are complete: each rank renamed its own before the barrier */
    if (failed == 1)
        die_runtime("--trace %s: writing the merged file failed (%s): " WRITE_FIX " — the ranks' timelines are "
                    "kept in %s.rank0.json … %s.rank%d.json (open them one by one)", g.file, why, g.file, g.file,
                    g.world - 1);
    if (failed)
        die_user("--trace %s: cannot write the merged file (%s); it is complete in %s — the ranks' timelines are "
                 "kept in %s.rank0.json … %s.rank%d.json (open them one by one); next time give --trace a regular "
                 "file in a writable directory", g.file, why, g.merged.tmp, g.file, g.file, g.world - 1);
    char steps[80] = ""; /* none held (the run ended before the window, or resumed past it): said above */
    if (g.held_a >= 0) snprintf(steps, sizeof steps, " of %s", held_steps());
    printf("trace: %d spans%s from %d ranks merged into %s (per rank: %s.rankN.json; open it "
           "in Perfetto or chrome://tracing; make timeline TRACE=%s draws it)%s\n",
           spans, steps, g.world, g.file, g.file, g.file, held_note());
}
