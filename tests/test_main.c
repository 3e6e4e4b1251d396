/* test_main.c — the Check runner: every suite, one summary line, exit status for make/CI.
 * Usage: tests/run_tests [suite]   (a suite name, e.g. "ops_cuda", runs that suite alone) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests.h"

typedef Suite *(*SuiteFn)(void);

int main(int argc, char **argv) {
    /* one suite per line, so branches that add suites merge cleanly */
    SuiteFn all[] = {
        suite_rng,
        suite_ops_ref,
        suite_ops_cuda,
        suite_fixtures,
        suite_data,
        suite_loader,
        suite_checkpoint,
        suite_cli,
        suite_model,
        suite_e2e,
        suite_gil,
        suite_dp,
        suite_dist,
        suite_ddp,
        suite_accum,
        suite_adam,
        suite_amp,
        suite_trace,
        suite_compare,
        suite_tutorial,
        suite_store,
        suite_resume,
        suite_flops,
    };
    const char *filter = argc > 1 ? argv[1] : NULL;
    /* Check's default is 4 s per test; end-to-end runs of ./stage1 on the CPU take longer. */
    setenv("CK_DEFAULT_TIMEOUT", "600", 0);
    /* Sanitizer builds run several times slower (make sanitize / tsan set TEST_TIME_SCALE): so may
     * every test case's time limit. */
    if (getenv("TEST_TIME_SCALE")) setenv("CK_TIMEOUT_MULTIPLIER", getenv("TEST_TIME_SCALE"), 0);
    SRunner *sr = NULL;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        Suite *s = all[i]();
        /* Check has no public suite-name getter; suites are named "name" in their constructor and
         * filtered by the CK_RUN_SUITE environment variable, which we set from argv[1]. */
        if (!sr) sr = srunner_create(s);
        else srunner_add_suite(sr, s);
    }
    if (filter) setenv("CK_RUN_SUITE", filter, 1);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
