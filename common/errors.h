/* errors.h — one way to fail: print where, what call, why, and how to fix it, then exit.
 *
 * Every library call that can fail goes through a CHECK_* macro, so a failure names its file:line,
 * the call as written, the library's own error string, and (where we know one) a hint. Bad user
 * input uses die_user(): same format, exit code 2, no "internal error" tone.
 * CUDA-specific macros live in device.h (they need the CUDA headers); this header is plain C. */
#ifndef ERRORS_H
#define ERRORS_H

#include <errno.h>
#include <stddef.h>

/* Print "file:line: call failed: why\n  hint: hint" to stderr and exit(1). hint may be NULL. */
_Noreturn void die_at(const char *file, int line, const char *call, const char *why, const char *hint);

/* Bad input from the user (flag, dataset file, checkpoint): "error: <message>" and exit(2). printf-style. */
_Noreturn void die_user(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A failure at run time that is nobody's bug (a peer process died, a timeout): "error: <message>"
 * and exit(1). printf-style. */
_Noreturn void die_runtime(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A system call that returns -1 / NULL on failure and sets errno. */
#define CHECK_SYS(call)                                                                            \
    do {                                                                                           \
        if ((call) == -1) die_at(__FILE__, __LINE__, #call, errno_string(), NULL);                 \
    } while (0)

/* malloc that never returns NULL. */
#define xmalloc(bytes) xmalloc_at(__FILE__, __LINE__, (bytes))
#define xcalloc(n, size) xcalloc_at(__FILE__, __LINE__, (n), (size))
void *xmalloc_at(const char *file, int line, size_t bytes);
void *xcalloc_at(const char *file, int line, size_t n, size_t size);
const char *errno_string(void);

/* ASSERT for invariants of our own code: a failure is a bug in this project, not bad input. */
#define ASSERT(cond)                                                                               \
    do {                                                                                           \
        if (!(cond)) die_at(__FILE__, __LINE__, "ASSERT(" #cond ")", "invariant violated",          \
                            "this is a bug in the trainer; please report it");                     \
    } while (0)

#endif
