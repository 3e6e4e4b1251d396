/* test_main.c — the Check runner: every suite, one summary line, exit status for make/CI.
 * Usage: tests/run_tests [suite...]   (suite names, e.g. "ops_cuda model", run those suites alone,
 * one summary line each; a name that matches no suite is an error) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests.h"

typedef Suite *(*SuiteFn)(void);

typedef struct Ran { int run, failed; } Ran;

/* Every suite into one runner; filter (NULL: all) is a suite name, passed to Check through the
 * CK_RUN_SUITE environment variable (Check has no public suite-name getter). */
static Ran run_suites(const char *filter) {
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
        suite_clip,
        suite_syncbn,
        suite_amp,
        suite_trace,
        suite_compare,
        suite_tutorial,
        suite_store,
        suite_resume,
        suite_flops,
    };
    SRunner *sr = NULL;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        Suite *s = all[i]();
        if (!sr) sr = srunner_create(s);
        else srunner_add_suite(sr, s);
    }
    if (filter) setenv("CK_RUN_SUITE", filter, 1);
    srunner_run_all(sr, CK_NORMAL);
    Ran r = {srunner_ntests_run(sr), srunner_ntests_failed(sr)};
    srunner_free(sr);
    return r;
}

int main(int argc, char **argv) {
    /* Check's default is 4 s per test; end-to-end runs of ./stage1 on the CPU take longer. */
    setenv("CK_DEFAULT_TIMEOUT", "600", 0);
    /* Sanitizer builds run several times slower (make sanitize / tsan set TEST_TIME_SCALE): so may
     * every test case's time limit. */
    if (getenv("TEST_TIME_SCALE")) setenv("CK_TIMEOUT_MULTIPLIER", getenv("TEST_TIME_SCALE"), 0);
    if (argc < 2) return run_suites(NULL).failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        Ran r = run_suites(argv[i]);
        const char *cases = getenv("CK_RUN_CASE");
        if (r.run == 0 && cases) {
            fprintf(stderr, "run_tests: no test ran for '%s' with CK_RUN_CASE='%s': the suite is unknown or has no "
                            "test case of that name (the cases are its tcase_create names; unset CK_RUN_CASE to "
                            "run them all)\n", argv[i], cases);
            return 2;
        }
        if (r.run == 0) {
            fprintf(stderr, "run_tests: no suite named '%s' (the names are the suite_* list in tests/test_main.c, "
                            "without suite_: e.g. ops_cuda, model, amp)\n", argv[i]);
            return 2;
        }
        failed += r.failed;
    }
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
