/* errors.c — the single exit path for failures (see errors.h). */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void die_at(const char *file, int line, const char *call, const char *why, const char *hint) {
    fflush(stdout);
    fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, call, why ? why : "(no reason given)");
    if (hint && hint[0]) fprintf(stderr, "  hint: %s\n", hint);
    exit(1);
}

static _Noreturn void die_message(int code, const char *fmt, va_list ap) {
    fflush(stdout);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    exit(code);
}

void (*die_user_hook)(void);

void die_user(const char *fmt, ...) {
    if (die_user_hook) die_user_hook(); /* the fuzzers' way back (it must not return) */
    va_list ap;
    va_start(ap, fmt);
    die_message(2, fmt, ap);
}

void die_runtime(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    die_message(1, fmt, ap);
}

void xthread_create_at(const char *file, int line, pthread_t *thread, void *(*fn)(void *), void *arg) {
    int rc = pthread_create(thread, NULL, fn, arg);
    if (rc != 0)
        die_at(file, line, "pthread_create", strerror(rc),
               "the process may be out of threads (ulimit -u); lower --workers or --gpus");
}

const char *errno_string(void) { return strerror(errno); }

void *xmalloc_at(const char *file, int line, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die_at(file, line, "malloc", "out of host memory", "reduce --batch-size or --train-size");
    return p;
}

void *xcalloc_at(const char *file, int line, size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die_at(file, line, "calloc", "out of host memory", "reduce --batch-size or --train-size");
    return p;
}
