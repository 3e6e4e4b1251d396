/* test_tutorial.c — the doc test: every command of docs/tutorial.md marked ```sh cpu-test runs and
 * exits as the tutorial says, and docs/tutorial.zh-CN.md holds the same commands in the same order
 * (tests/tutorial_test.sh does the work). The other tests feed that script small broken tutorials, so
 * we know it fails — naming the block — when a command breaks or the translation drifts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests.h"

/* Run tests/tutorial_test.sh on two Markdown files (NULL, NULL: the real tutorial and its twin). */
static int run_doc_test(const char *md, const char *twin, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "bash %s/tests/tutorial_test.sh %s %s", test_root(), md ? md : "", twin ? twin : "");
    return test_run(cmd, out);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_msg(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

START_TEST(tutorial_cpu_commands_run) {
    char *out;
    int rc = run_doc_test(NULL, NULL, &out);
    ck_assert_msg(rc == 0, "a command of docs/tutorial.md failed, or the translation differs:\n%s", out);
    /* It really ran something: every stage's training command, not only --help. */
    const char *must[] = {"./stage1 --device cpu", "./stage2 --device cpu", "./stage3 --device cpu",
                          "./stage4 --device cpu", "STAGE3_FAIL_AT=1:3"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        ck_assert_msg(strstr(out, must[i]), "the doc test did not run a block with '%s':\n%s", must[i], out);
    printf("%s", strstr(out, "tutorial_test:") ? strstr(out, "tutorial_test:") : "");
    free(out);
}
END_TEST

/* A tutorial with a good block, a broken one and a pending one: the script fails and names block 2
 * and its line; the good block still reports ok; the pending block is not run. */
START_TEST(tutorial_test_fails_on_a_broken_command) {
    char *dir = test_tmpdir(), en[512], zh[512], *out;
    snprintf(en, sizeof en, "%s/t.md", dir);
    snprintf(zh, sizeof zh, "%s/t.zh.md", dir);
    const char *doc_en = "# t\n\n```sh cpu-test\n./stage1 --help   # every flag\n```\n\ntext\n\n"
                         "```sh cpu-test\n./stage1 --device cpu --no-such-flag\n```\n\n"
                         "```sh cpu-test-pending\nexit 7\n```\n";
    const char *doc_zh = "# t\n\n```sh cpu-test\n./stage1 --help   # 所有参数\n```\n\n文字\n\n"
                         "```sh cpu-test\n# 一条注释\n./stage1 --device cpu --no-such-flag\n```\n\n"
                         "```sh cpu-test-pending\nexit 7\n```\n";
    write_file(en, doc_en);
    write_file(zh, doc_zh);
    int rc = run_doc_test(en, zh, &out);
    ck_assert_msg(rc != 0, "a broken command passed the doc test:\n%s", out);
    ck_assert_msg(strstr(out, "FAIL: block 2 (") && strstr(out, "line 9)"), "the failure does not name block 2, line 9:\n%s", out);
    ck_assert_msg(strstr(out, "unknown option '--no-such-flag'"), "the command's own error is not shown:\n%s", out);
    ck_assert_msg(strstr(out, "ok   block  1"), "the good block was not reported ok:\n%s", out);
    ck_assert_msg(strstr(out, "1 pending"), "the pending block was not counted:\n%s", out);
    ck_assert_msg(!strstr(out, "differs"), "comments alone made the translation differ:\n%s", out);
    free(out);

    /* Fixed, the same tutorial passes (so it was the command, not the harness). */
    write_file(en, "```sh cpu-test\n./stage1 --help\n```\n```sh cpu-test exit=1\nfalse\n```\n");
    write_file(zh, "```sh cpu-test\n./stage1 --help\n```\n```sh cpu-test exit=1\nfalse\n```\n");
    rc = run_doc_test(en, zh, &out);
    ck_assert_msg(rc == 0, "a good tutorial failed:\n%s", out);
    free(out);

    /* exit=N is checked exactly: a command expected to fail that succeeds is a failure. */
    write_file(en, "```sh cpu-test exit=3\ntrue\n```\n");
    write_file(zh, "```sh cpu-test exit=3\ntrue\n```\n");
    rc = run_doc_test(en, zh, &out);
    ck_assert_msg(rc != 0 && strstr(out, "FAIL: block 1") && strstr(out, "expects 3"), "exit=3 not enforced:\n%s", out);
    free(out), free(dir);
}
END_TEST

/* The translation must hold the same commands in the same order, with the same markers. */
START_TEST(tutorial_test_fails_when_the_translation_drifts) {
    char *dir = test_tmpdir(), en[512], zh[512], *out;
    snprintf(en, sizeof en, "%s/t.md", dir);
    snprintf(zh, sizeof zh, "%s/t.zh.md", dir);
    write_file(en, "```sh cpu-test\n./stage1 --help\n```\n```sh cpu-test\n./stage2 --help\n```\n");
    write_file(zh, "```sh cpu-test\n./stage1 --help\n```\n```sh cpu-test\n./stage2 --help --x\n```\n");
    int rc = run_doc_test(en, zh, &out);
    ck_assert_msg(rc != 0 && strstr(out, "block 2 differs"), "a changed command in the twin passed:\n%s", out);
    free(out);
    write_file(zh, "```sh cpu-test\n./stage1 --help\n```\n```sh\n./stage2 --help\n```\n");
    rc = run_doc_test(en, zh, &out);
    ck_assert_msg(rc != 0 && strstr(out, "block 2 differs"), "a changed marker in the twin passed:\n%s", out);
    free(out);
    write_file(zh, "```sh cpu-test\n./stage1 --help\n```\n");
    rc = run_doc_test(en, zh, &out);
    ck_assert_msg(rc != 0 && strstr(out, "has 2"), "a missing block in the twin passed:\n%s", out);
    free(out), free(dir);
}
END_TEST

Suite *suite_tutorial(void) {
    Suite *s = suite_create("tutorial");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, tutorial_cpu_commands_run);
    tcase_add_test(tc, tutorial_test_fails_on_a_broken_command);
    tcase_add_test(tc, tutorial_test_fails_when_the_translation_drifts);
    suite_add_tcase(s, tc);
    return s;
}
