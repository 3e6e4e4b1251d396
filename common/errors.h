/* errors.h — one way to fail: print where, what call, why, and how to fix it, then exit.
 *
 * Every library call that can fail goes through a CHECK_* macro, so a failure names its file:line,
 * the call as written, the library's own error string, and (where we know one) a hint. Bad user
 * input uses die_user(): same format, exit code 2, no "internal error" tone.
 * CUDA-specific macros live in device.h (they need the CUDA headers); this header is plain C. */
#ifndef ERRORS_H
#define ERRORS_H

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

/* Print "file:line: call failed: why\n  hint: hint" to stderr and exit(1). hint may be NULL. */
_Noreturn void die_at(const char *file, int line, const char *call, const char *why, const char *hint);

/* Bad input from the user (flag, dataset file, checkpoint): "error: <message>" and exit(2). printf-style. */
_Noreturn void die_user(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Test-only: when set, die_user calls it (silently) instead of exiting; it must not return (the
 * fuzzers in tests/fuzz/ longjmp back, so rejected input is not a crash). */
extern void (*die_user_hook)(void);
/* When set, the first failure (die_at, die_user, die_runtime) calls it once, after printing and
 * before exiting: a process's last words to peers that wait on it (resume.c's gate tells the
 * other ranks that rank 0 refused the checkpoint, so they need not wait for a timeout). */
extern void (*die_last_words)(void);
/* When set, the first failure calls it before its last words and before exit()'s handlers: when the
 * process decided to exit (worker_status.c's exit time for the launcher), which a library's slow
 * teardown in an exit handler of its own (the CUDA runtime's) would otherwise put seconds later. */
extern void (*die_exit_note)(void);
/* Exit with `code` as a failure that has printed its message already: the path every die_* ends in
 * (the exit note, the last words, one exit() per process however many threads fail). */
_Noreturn void die_exit(int code);
/* A failure at run time that is nobody's bug (a peer process died, a timeout): "error: <message>"
 * and exit(1). printf-style. */
_Noreturn void die_runtime(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* die_user (code 2, without its hook) or die_runtime (code 1), the code chosen by the caller: for
 * wrappers that do something of their own first (worker_status.h's die_collateral). */
_Noreturn void die_vcode(int code, const char *fmt, va_list ap);

/* A system call that returns -1 / NULL on failure and sets errno. */
#define CHECK_SYS(call)                                                                            \
    do {                                                                                           \
        if ((call) == -1) die_at(__FILE__, __LINE__, #call, errno_string(), NULL);                 \
    } while (0)

/* A pthread call: they return an error number (0 = success) instead of setting errno. */
#define CHECK_PT(call)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) die_at(__FILE__, __LINE__, #call, strerror(rc_), NULL);                      \
    } while (0)

/* Threads, mutexes and condition variables that are either created or end the program with a
 * message naming the caller's file:line (pthread_create fails when the process is out of threads). */
#define xthread_create(thread, fn, arg) xthread_create_at(__FILE__, __LINE__, (thread), (fn), (arg))
void xthread_create_at(const char *file, int line, pthread_t *thread, void *(*fn)(void *), void *arg);
#define xmutex_init(mutex) CHECK_PT(pthread_mutex_init((mutex), NULL))
#define xcond_init(cond) CHECK_PT(pthread_cond_init((cond), NULL))

/* malloc, calloc, realloc and strndup that never return NULL. */
#define xmalloc(bytes) xmalloc_at(__FILE__, __LINE__, (bytes))
#define xcalloc(n, size) xcalloc_at(__FILE__, __LINE__, (n), (size))
#define xrealloc(p, bytes) xrealloc_at(__FILE__, __LINE__, (p), (bytes))
#define xstrndup(s, n) xstrndup_at(__FILE__, __LINE__, (s), (n))
#define xstrdup(s) xstrndup_at(__FILE__, __LINE__, (s), (size_t)-1)
/* Host memory the kernel would still hand out (/proc/meminfo's MemAvailable, else the physical memory). */
double host_mem_available(void);
void *xmalloc_at(const char *file, int line, size_t bytes);
void *xcalloc_at(const char *file, int line, size_t n, size_t size);
void *xrealloc_at(const char *file, int line, void *p, size_t bytes);
char *xstrndup_at(const char *file, int line, const char *s, size_t n);
const char *errno_string(void);
/* An output file the user named (--report, --trace) that could not be opened: when it is there and
 * this user may not write it — another user's, in a shared directory such as /tmp — refused naming
 * its owner and mode, for a generic "check its directory" would point at the wrong thing. Returns
 * otherwise, for the caller's own message. */
void die_if_others_file(const char *flag, const char *path);
/* 1 when path is a regular file another process holds a write lock on (an OFD or POSIX lock, as
 * --report and --trace take theirs): the launcher's look before its workers open it. Creates nothing. */
int file_locked_by_another(const char *path);
/* mkdir -p for the directory a flag names (--save DIR, write_synthetic's DIR): every missing part is
 * made; one that cannot be, or a path that is not a directory, is the user's error naming the flag. */
void make_dirs(const char *flag, const char *dir);

/* ASSERT for invariants of our own code: a failure is a bug in this project, not bad input. */
#define ASSERT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) die_at(__FILE__, __LINE__, "ASSERT(" #cond ")", "invariant violated",          \
                            "this is a bug in the trainer; please report it");                     \
    } while (0)

#endif
