/* fuzz_checkpoint.c — libFuzzer harness: checkpoint_load on arbitrary bytes (a tiny model of 1000
 * parameters and 37 buffer values, as tests/test_checkpoint.c), seeds in tests/fuzz/checkpoint/. */
#include <string.h>

#include "checkpoint.h"
#include "fuzz_common.h"

enum { NP = 1000, NB = 37 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/fuzz_ckpt_%d.ckpt", (int)getpid());
    static float p[NP], b[NB], m[NP];
    CheckpointMeta expect = {.arch = "tiny", .norm = "bn", .n_params = NP, .n_buffers = NB,
                             .shape_hash = 0x0123456789abcdefull}, got;
    fuzz_write(path, data, n);
    die_user_hook = fuzz_rejected;
    int fd = fuzz_first_free_fd();
    if (!setjmp(fuzz_back)) checkpoint_load(path, &expect, &got, p, b, m, NULL);
    else fuzz_close_from(fd);
    die_user_hook = NULL;
    return 0;
}
