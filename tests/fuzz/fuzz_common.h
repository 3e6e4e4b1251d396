/* fuzz_common.h — what the libFuzzer harnesses share: rejected input (die_user) is an answer, not a
 * crash, so die_user jumps back here; any other exit, abort or sanitizer report is a finding. */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "errors.h"

static jmp_buf fuzz_back;
static void fuzz_rejected(void) { longjmp(fuzz_back, 1); }

/* Write data to path (the loaders under test read files). */
static void fuzz_write(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) abort();
    fclose(f);
}

/* A loader that rejects its input leaves its file open (it exits in real use): close what it opened. */
static int fuzz_first_free_fd(void) {
    int fd = dup(0);
    close(fd);
    return fd;
}
static void fuzz_close_from(int fd) {
    for (int i = fd; i < fd + 16; i++) close(i);
}

#endif
