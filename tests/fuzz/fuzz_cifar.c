/* fuzz_cifar.c — libFuzzer harness: the CIFAR-10 binary reader on arbitrary bytes (as test_batch.bin),
 * seeds in tests/fuzz/cifar/. */
#include <string.h>
#include <sys/stat.h>

#include "data.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    static char dir[64], path[96];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_cifar_%d", (int)getpid());
        mkdir(dir, 0700);
        snprintf(path, sizeof path, "%s/test_batch.bin", dir);
    }
    fuzz_write(path, data, n);
    die_user_hook = fuzz_rejected;
    int fd = fuzz_first_free_fd();
    Dataset ds;
    memset(&ds, 0, sizeof ds);
    if (!setjmp(fuzz_back)) {
        dataset_cifar10(&ds, dir, 0, n % 7 ? 0 : 3); /* sometimes with a --test-size limit */
        dataset_free(&ds);
    } else {
        fuzz_close_from(fd);
        dataset_free(&ds); /* what it had allocated before rejecting */
    }
    die_user_hook = NULL;
    return 0;
}
