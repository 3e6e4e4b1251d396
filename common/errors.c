/* errors.c — the single exit path for failures (see errors.h). */
#include "errors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One message, one write(2): when several ranks of a job fail at once into the same stderr, their
 * lines then come out whole, never interleaved mid-word (a pipe write up to PIPE_BUF is atomic). */
static void say(const char *msg) {
    size_t len = strlen(msg), off = 0;
    while (off < len) {
        ssize_t w = write(STDERR_FILENO, msg + off, len - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
}

/* exit() called by two threads at once is undefined: both run the libraries' exit handlers (cuBLAS's
 * crashed when two ranks in one test process failed together; stage 2's device threads can fail
 * together too). The first failure exits; one from another thread, already printed, waits for that
 * exit. A failure inside the exit itself (an exit handler's) ends the process at once. */
_Noreturn void die_exit(int code) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int leaving;
    static pthread_t leaver;
    pthread_mutex_lock(&mu);
    int first = !leaving, again = leaving && pthread_equal(leaver, pthread_self());
    if (first) leaving = 1, leaver = pthread_self();
    pthread_mutex_unlock(&mu);
    if (again) _exit(code);
    if (!first)
        for (;;) pause();
    if (die_exit_note) die_exit_note();
    void (*last)(void) = die_last_words;
    die_last_words = NULL;
    if (last) last();
    exit(code);
}

void (*die_last_words)(void);
void (*die_exit_note)(void);

void die_at(const char *file, int line, const char *call, const char *why, const char *hint) {
    fflush(stdout);
    char msg[4096];
    int k = snprintf(msg, sizeof msg, "%s:%d: %s failed: %s\n", file, line, call, why ? why : "(no reason given)");
    if (hint && hint[0] && k >= 0 && (size_t)k < sizeof msg) snprintf(msg + k, sizeof msg - k, "  hint: %s\n", hint);
    say(msg);
    die_exit(1);
}

void (*die_user_hook)(void);

void die_vcode(int code, const char *fmt, va_list ap) {
    fflush(stdout);
    char *body = NULL, *msg = NULL;
    va_list copy;
    va_copy(copy, ap);
    /* any length: a message that names a long path must still reach its fix */
    if (vasprintf(&body, fmt, copy) >= 0 && asprintf(&msg, "error: %s\n", body) >= 0) {
        say(msg);
    } else { /* out of memory: as much as fits */
        char small[4096] = "error: ";
        size_t k = strlen(small);
        vsnprintf(small + k, sizeof small - k - 1, fmt, ap);
        strcat(small, "\n");
        say(small);
    }
    va_end(copy);
    free(body), free(msg);
    die_exit(code);
}

void die_user(const char *fmt, ...) {
    if (die_user_hook) die_user_hook(); /* the fuzzers' way back (it must not return) */
    va_list ap;
    va_start(ap, fmt);
    die_vcode(2, fmt, ap);
}

void die_runtime(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    die_vcode(1, fmt, ap);
}

void xthread_create_at(const char *file, int line, pthread_t *thread, void *(*fn)(void *), void *arg) {
    int rc = pthread_create(thread, NULL, fn, arg);
    if (rc != 0)
        die_at(file, line, "pthread_create", strerror(rc),
               "the process may be out of threads (ulimit -u); lower --workers or --gpus");
}

const char *errno_string(void) { return strerror(errno); }

void die_if_others_file(const char *flag, const char *path) {
    struct stat st;
    const int was = errno; /* the caller's own message names the open's error */
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || access(path, W_OK) == 0 || errno != EACCES) {
        errno = was;
        return;
    }
    die_user("%s: cannot write '%s': %s — the file is there and this user may not write it (owner uid %d, mode "
             "%03o: another user's file, in a shared directory?) — give %s a file of your own", flag, path,
             strerror(EACCES), (int)st.st_uid, (int)(st.st_mode & 0777), flag);
}

_Noreturn static void mkdir_failed(const char *flag, const char *dir, const char *at) {
    const int err = errno;
    const char *why = "", *fix = "a directory you can create (check its parent's permissions)";
    if (err == ENOTDIR) why = "part of that path is a file, not a directory: ", fix = "another directory";
    else if (err == ENOENT || err == EROFS) /* e.g. under /proc or /sys, or a read-only mount */
        why = "the file system there takes no new directories: ", fix = "a directory on a writable disk";
    else if (err == ENOSPC || err == EDQUOT) why = "the disk (or your quota) is full: free space or ", fix = "another disk";
    die_user("%s '%s': cannot create it (mkdir('%s'): %s) — %sgive %s %s", flag, dir, at, strerror(err), why, flag, fix);
}

void make_dirs(const char *flag, const char *dir) {
    char *p = xstrdup(dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) mkdir_failed(flag, dir, p);
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST) mkdir_failed(flag, dir, p);
    free(p);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        die_user("%s '%s' exists and is not a directory (%s takes a directory)", flag, dir, flag);
}

int file_locked_by_another(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    const int was = errno, fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY); /* not created, not emptied */
    struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    const int locked = fd >= 0 && fcntl(fd, F_OFD_GETLK, &lk) == 0 && lk.l_type != F_UNLCK;
    if (fd >= 0) close(fd);
    errno = was;
    return locked;
}

double host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char row[256];
    long long kb = -1;
    while (f && fgets(row, sizeof row, f))
        if (sscanf(row, "MemAvailable: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb >= 0) return (double)kb * 1024;
    return (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
}

/* Any size on the command line can reach an allocation: name the request, not one guessed flag. */
static _Noreturn void out_of_host_memory(const char *file, int line, const char *call, double bytes) {
    char what[160];
    snprintf(what, sizeof what, "out of host memory (%.0f bytes asked for, %.0f available)", bytes,
             host_mem_available());
    die_at(file, line, call, what,
           "the sizes given (--batch-size, --train-size, --test-size, --dataset-size, --nproc-per-node …) need "
           "more memory than this machine has: give smaller ones");
}

/* Linux overcommits: a malloc past the free memory succeeds, and the kernel kills the process (exit
 * 137, no message) as the pages fill. So a request of a GiB or more is first held against what the
 * kernel would still hand out. */
static void check_fits(const char *file, int line, const char *call, double bytes) {
    if (bytes >= 1073741824.0 && bytes > host_mem_available()) out_of_host_memory(file, line, call, bytes);
}

void *xmalloc_at(const char *file, int line, size_t bytes) {
    check_fits(file, line, "malloc", (double)bytes);
    void *p = malloc(bytes ? bytes : 1);
    if (!p) out_of_host_memory(file, line, "malloc", (double)bytes);
    return p;
}

void *xcalloc_at(const char *file, int line, size_t n, size_t size) {
    check_fits(file, line, "calloc", (double)n * (double)size);
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_host_memory(file, line, "calloc", (double)n * (double)size);
    return p;
}

void *xrealloc_at(const char *file, int line, void *p, size_t bytes) {
    check_fits(file, line, "realloc", (double)bytes);
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) out_of_host_memory(file, line, "realloc", (double)bytes);
    return q;
}

char *xstrndup_at(const char *file, int line, const char *s, size_t n) {
    char *p = strndup(s, n);
    if (!p) out_of_host_memory(file, line, "strndup", (double)strnlen(s, n) + 1);
    return p;
}
