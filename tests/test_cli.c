/* test_cli.c — the command-line parser, the shared configuration and the report writer.
 *
 * Every kind of bad input must exit with status 2 and a message that names the flag, so each error
 * case runs the parser in a forked child with stdout+stderr captured, and checks status and text. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <math.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "data.h"
#include "errors.h"
#include "report.h"
#include "rng.h"
#include "trace.h"
#include "tests.h"


/* ----------------------------------------------------------------------------------------------
 * parsing a command line into a TrainConfig (+ one stage-specific row, as stage 2 adds --gpus) */

typedef struct {
    const char *const *args; /* NULL-terminated, without argv[0] */
    int resolve;             /* also run config_resolve(c, resolve_cuda) */
    int resolve_cuda;
} ParseJob;

static TrainConfig g_cfg;
static int g_gpus;

static void parse_into(TrainConfig *c, const char *const *args) {
    static char *argv[64];
    int argc = 0;
    argv[argc++] = "stageX";
    for (int i = 0; args[i]; i++) argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    config_defaults(c);
    g_gpus = 1;
    const Option extra[] = {{"gpus", OPT_INT, &g_gpus, 1, 64, NULL, "GPUs to use (stage-specific row)"},
                            {NULL, 0, NULL, 0, 0, NULL, NULL}};
    /* the table stays alive, as a stage's does: config_resolve asks cli_given, which reads it */
    static Option *t;
    free(t);
    t = config_options(c, extra);
    cli_parse(argc, argv, t, "stageX", "stageX: a test program.");
}

static void parse_child(void *arg) {
    ParseJob *j = arg;
    TrainConfig c;
    parse_into(&c, j->args);
    if (j->resolve) config_resolve(&c, j->resolve_cuda, 0);
}

/* Expect `args` to be refused: exit status 2 and every one of the NULL-terminated `want` fragments
 * in the output. */
static void expect_refused(const char *const *args, const char *const *want) {
    ParseJob j = {args, 1, 0};
    char *out = NULL;
    int st = test_run_captured(parse_child, &j, &out);
    char cmd[512] = "";
    for (int i = 0; args[i]; i++) {
        strncat(cmd, args[i], sizeof cmd - strlen(cmd) - 2);
        strncat(cmd, " ", sizeof cmd - strlen(cmd) - 1);
    }
    ck_assert_msg(st == 2, "'%s' exited %d (want 2), output: %s", cmd, st, out);
    ck_assert_msg(strncmp(out, "error: ", 7) == 0, "'%s': message should start with 'error: ', got: %s", cmd, out);
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(out, want[i]), "'%s': output lacks \"%s\": %s", cmd, want[i], out);
    free(out);
}
#define REFUSED(ARGS, ...) expect_refused((const char *const[]){ARGS, NULL}, (const char *const[]){__VA_ARGS__, NULL})
#define A(...) __VA_ARGS__

START_TEST(test_good_parse) {
    const char *args[] = {"--batch-size", "64",     "--lr=0.05",  "--momentum", "0",           "--seed",
                          "4294967295",   "--steps=1000000000000", "--norm",     "none",        "--data=/nope",
                          "--save",       "ck",     "--model=tiny", "--weight-decay", "1",       "--epochs",
                          "100000",       "--gpus", "8",          "--test-size", "1",           "--workers=0",
                          NULL};
    parse_into(&g_cfg, args);
    ck_assert_int_eq(g_cfg.batch_size, 64);
    ck_assert(g_cfg.lr == 0.05);
    ck_assert(g_cfg.momentum == 0.0);
    ck_assert_int_eq(g_cfg.seed, 4294967295LL);
    ck_assert_int_eq(g_cfg.steps, 1000000000000LL);
    ck_assert_str_eq(g_cfg.norm, "none");
    ck_assert_str_eq(g_cfg.data, "/nope");
    ck_assert_str_eq(g_cfg.save, "ck");
    ck_assert_str_eq(g_cfg.model, "tiny");
    ck_assert(g_cfg.weight_decay == 1.0);
    ck_assert_int_eq(g_cfg.epochs, 100000);
    ck_assert_int_eq(g_gpus, 8);
    ck_assert_int_eq(g_cfg.test_size, 1);
    ck_assert_int_eq(g_cfg.workers, 0);
    /* untouched fields keep their defaults */
    ck_assert_str_eq(g_cfg.schedule, "cosine");
    ck_assert_int_eq(g_cfg.log_every, 50);
    ck_assert_int_eq(g_cfg.train_size, -1);
    /* a value that is "-h" (or starts with "--") can still be given, after '=' */
    const char *odd[] = {"--save=-h", "--data=--odd", NULL};
    parse_into(&g_cfg, odd);
    ck_assert_str_eq(g_cfg.save, "-h");
    ck_assert_str_eq(g_cfg.data, "--odd");
}
END_TEST

START_TEST(test_last_wins_flags_choices) {
    const char *args[] = {"--lr",        "0.1",       "--lr=1e-3",       "--lr",       "100",    "--device",
                          "cpu",         "--device=cuda", "--schedule", "const",     "--progress", "off",
                          "--deterministic", "--no-tf32", "--pin-memory", "--deterministic", "--momentum", "0.999",
                          "--report",    "r.jsonl",   "--resume", "a.ckpt", "--resume=b.ckpt", NULL};
    parse_into(&g_cfg, args);
    ck_assert(g_cfg.lr == 100.0);
    ck_assert_str_eq(g_cfg.device, "cuda");
    ck_assert_str_eq(g_cfg.schedule, "const");
    ck_assert_str_eq(g_cfg.progress, "off");
    ck_assert_int_eq(g_cfg.deterministic, 1);
    ck_assert_int_eq(g_cfg.no_tf32, 1);
    ck_assert_int_eq(g_cfg.pin_memory, 1);
    ck_assert_int_eq(g_cfg.cudnn_benchmark, 0);
    ck_assert(g_cfg.momentum == 0.999);
    ck_assert_str_eq(g_cfg.report, "r.jsonl");
    ck_assert_str_eq(g_cfg.resume, "b.ckpt");
    const char *args2[] = {"--cudnn-benchmark", "--model", "resnet18", "--progress=on", "--device", "auto", NULL};
    parse_into(&g_cfg, args2);
    ck_assert_int_eq(g_cfg.cudnn_benchmark, 1);
    ck_assert_str_eq(g_cfg.model, "resnet18");
    ck_assert_str_eq(g_cfg.progress, "on");
    ck_assert_str_eq(g_cfg.device, "auto");
}
END_TEST

START_TEST(test_bad_numbers) {
    REFUSED(A("--batch-size", "abc"), "--batch-size must be an integer in [1, 65536], got 'abc'");
    REFUSED(A("--batch-size", "12x"), "--batch-size", "'12x'");
    REFUSED(A("--batch-size=0"), "--batch-size", "[1, 65536]", "'0'");
    REFUSED(A("--batch-size", "65537"), "--batch-size", "'65537'");
    REFUSED(A("--batch-size", "1e3"), "--batch-size", "integer");
    REFUSED(A("--batch-size", " 5"), "--batch-size");
    REFUSED(A("--batch-size", "0x10"), "--batch-size");
    REFUSED(A("--batch-size", "99999999999999999999999"), "--batch-size");
    REFUSED(A("--epochs", "-1"), "--epochs", "[1, 100000]", "'-1'");
    REFUSED(A("--epochs", "2.5"), "--epochs", "'2.5'");
    REFUSED(A("--steps", "-5"), "--steps");
    REFUSED(A("--steps", "99999999999999999999"), "--steps");
    REFUSED(A("--seed", "-1"), "--seed", "[0, 4294967295]", "'-1'");
    REFUSED(A("--seed", "4294967296"), "--seed");
    REFUSED(A("--lr", "0"), "--lr must be a number in (0, 100], got '0'");
    REFUSED(A("--lr", "-0.1"), "--lr", "(0, 100]");
    REFUSED(A("--lr", "100.5"), "--lr");
    REFUSED(A("--lr", "nan"), "--lr", "'nan'");
    REFUSED(A("--lr", "inf"), "--lr", "finite");
    REFUSED(A("--lr", "1e999"), "--lr");
    REFUSED(A("--lr="), "--lr", "''");
    REFUSED(A("--lr", "0.1.2"), "--lr", "'0.1.2'");
    REFUSED(A("--lr", "0x10"), "--lr must be a decimal number", "'0x10'"); /* strtod would read 16 */
    REFUSED(A("--lr", "0X1p-3"), "--lr must be a decimal number");
    /* above 0 as a double, 0 as the fp32 the SGD step multiplies by: a slip for 1e-5 trained nothing */
    REFUSED(A("--lr", "1e-50"), "--lr must be a number in (0, 100], got '1e-50'", "fp32 rounds it to 0");
    REFUSED(A("--clip-grad-norm", "1e-50"), "--clip-grad-norm", "fp32 rounds it to 0"); /* on, clipping to 0 */
    TrainConfig tiny_lr;
    parse_into(&tiny_lr, (const char *const[]){"--lr", "1e-45", NULL}); /* fp32's smallest value: not 0 */
    ck_assert((float)tiny_lr.lr > 0);
    REFUSED(A("--momentum", "1"), "--momentum must be a number in [0, 1), got '1'");
    REFUSED(A("--momentum", "-0.5"), "--momentum");
    REFUSED(A("--weight-decay", "2"), "--weight-decay", "[0, 1]");
    REFUSED(A("--log-every", "0"), "--log-every");
    REFUSED(A("--workers", "65"), "--workers", "[0, 64]");
    REFUSED(A("--train-size", "0"), "--train-size");
    REFUSED(A("--test-size", "x"), "--test-size");
    REFUSED(A("--gpus", "0"), "--gpus", "[1, 64]"); /* extra rows are validated the same way */
}
END_TEST

/* What --help shows as "default auto" can be typed: "auto" puts that default back, and the flag then
 * counts as not given (--evaluate adopts the checkpoint's model only where --model was not given).
 * A default that is a number is no "auto" to put back. */
START_TEST(test_auto_is_a_value_where_it_is_the_default) {
    const char *args[] = {"--epochs", "7", "--epochs", "auto", "--model=tiny", "--model=auto", "--train-size", "auto",
                          "--test-size", "auto", "--test-size", "5", "--cpu-threads", "auto", NULL};
    parse_into(&g_cfg, args);
    TrainConfig d;
    config_defaults(&d);
    ck_assert_int_eq(g_cfg.epochs, d.epochs);
    ck_assert_str_eq(g_cfg.model, d.model);
    ck_assert_int_eq(g_cfg.train_size, d.train_size);
    ck_assert_int_eq(g_cfg.test_size, 5);
    ck_assert_int_eq(g_cfg.cpu_threads, d.cpu_threads);
    ck_assert_msg(!cli_given("epochs") && !cli_given("model") && !cli_given("train-size") && cli_given("test-size"),
                  "an 'auto' counts as not given; a later value as given");
    REFUSED(A("--epochs", "x"), "--epochs must be an integer in [1, 100000] or auto, got 'x'");
    REFUSED(A("--batch-size", "auto"), "--batch-size must be an integer in [1, 65536], got 'auto'");
    REFUSED(A("--lr", "auto"), "--lr", "'auto'");
    REFUSED(A("--model", "automatic"), "--model must be one of resnet18|tiny");
}
END_TEST

START_TEST(test_bad_choices_and_syntax) {
    REFUSED(A("--norm", "batch"), "--norm must be one of bn|none, got 'batch'");
    REFUSED(A("--model=resnet50"), "--model", "resnet18|tiny", "'resnet50'");
    REFUSED(A("--device", "gpu"), "--device", "auto|cuda|cpu");
    REFUSED(A("--schedule", "Cosine"), "--schedule", "const|cosine");
    REFUSED(A("--progress", ""), "--progress", "auto|on|off");
    /* copied from a slide or chat that made "--" a dash: say so, not "unexpected argument" */
    REFUSED(A("\xe2\x80\x94" "epochs", "2"), "starts with a long dash (\xe2\x80\x94), not two hyphens", "type two hyphens, --epochs");
    REFUSED(A("\xe2\x80\x93" "lr", "0.1"), "type two hyphens, --lr");
    REFUSED(A("--bach-size", "5"), "unknown option '--bach-size' (did you mean --batch-size?)");
    REFUSED(A("--batch", "5"), "unknown option '--batch'", "--batch-size");
    REFUSED(A("--learning-rate=0.1"), "unknown option '--learning-rate'");
    REFUSED(A("--zzzzzzzz"), "unknown option '--zzzzzzzz'");
    REFUSED(A("--5"), "unknown option '--5' (see --help for the list)"); /* not "did you mean --lr?" */
    REFUSED(A("--l", "0.1"), "did you mean --lr?");
    REFUSED(A("-lr", "0.1"), "unknown option '-lr'", "--lr");
    REFUSED(A("-b", "64"), "unknown option '-b': options are long (--name VALUE; only -h is short)"); /* not "--lr?" */
    /* no name to correct: not "did you mean --lr?" (an empty name is within two edits of it) */
    REFUSED(A("--"), "'--' names no option", "there are no other arguments");
    REFUSED(A("--=5"), "'--=5' names no option");
    /* the help flag with a value: known, not "unknown option '-h' … only -h is short" */
    REFUSED(A("-h=1"), "-h is a flag and takes no value, got '1' (write just -h)");
    REFUSED(A("--help=yes"), "--help is a flag and takes no value, got 'yes' (write just --help)");
    REFUSED(A("--lr"), "--lr needs a value");
    REFUSED(A("--lr", "--momentum", "0.5"), "--lr needs a value");
    /* help asked for after a flag that wanted a value: not a run that saves into a folder named "-h" */
    REFUSED(A("--save", "-h"), "--save needs a value, got option '-h' instead");
    REFUSED(A("--epochs", "-h"), "--epochs needs a value, got option '-h' instead");
    REFUSED(A("--data"), "--data needs a value");
    REFUSED(A("--resume", ""), "--resume got an empty value", "leave the flag out"); /* not "no checkpoint" */
    REFUSED(A("--data="), "--data got an empty value");
    /* the shell leaves ~ after '=' alone: --save=~/ck used to create a folder named "~" here */
    REFUSED(A("--save=~/ck"), "--save '~/ck' starts with '~'", "did not expand", "--save ~/ck with a space", "./~/ck");
    /* help asked for after a flag that wanted a value: not a run that saves into a folder named "-h" */
    REFUSED(A("--save", "-h"), "--save needs a value, got option '-h' instead");
    REFUSED(A("--epochs", "-h"), "--epochs needs a value, got option '-h' instead");
    REFUSED(A("--data", "~"), "--data '~' starts with '~'");
    /* a variable that held a space, and "-" for standard output: --report " " and --report - wrote files of
     * those names here, and --trace - a trace named "-" */
    REFUSED(A("--report", " "), "--report got only spaces", "give it FILE, or leave the flag out");
    REFUSED(A("--data=\t"), "--data got only spaces");
    REFUSED(A("--report", "-"), "--report '-': no flag here reads or writes standard input or output",
            "give --report a FILE (write ./- for one really named '-')");
    REFUSED(A("--trace=-"), "--trace '-'", "give --trace a FILE");
    REFUSED(A("--save", "-"), "--save '-'", "give --save a DIR");
    REFUSED(A("--deterministic=1"), "--deterministic is a flag", "'1'");
    REFUSED(A("--pin-memory=true"), "--pin-memory");
    REFUSED(A("train"), "unexpected argument 'train'");
    REFUSED(A("--lr", "0.1", "0.2"), "unexpected argument '0.2'");
    REFUSED(A("-"), "unexpected argument '-'");
}
END_TEST

static void help_child(void *arg) {
    const char *args[] = {"--lr", "0.5", (const char *)arg, "--lr", "junk", NULL};
    TrainConfig c;
    parse_into(&c, args);
}

START_TEST(test_help) {
    const char *forms[] = {"--help", "-h"};
    for (int k = 0; k < 2; k++) {
        char *out = NULL;
        int st = test_run_captured(help_child, (void *)forms[k], &out);
        ck_assert_msg(st == 0, "%s exited %d: %s", forms[k], st, out);
        ck_assert_msg(strstr(out, "stageX: a test program."), "help lacks the about text: %s", out);
        TrainConfig c;
        config_defaults(&c);
        Option *t = config_options(&c, NULL);
        for (Option *o = t; o->name; o++) {
            char flag[64];
            snprintf(flag, sizeof flag, "--%s", o->name);
            ck_assert_msg(strstr(out, flag), "help lacks %s:\n%s", flag, out);
            ck_assert_msg(o->help && o->help[0], "%s has no help text", flag);
            /* --no-tf32 changes the convolutions only: the linear layer's cuBLAS handle runs plain fp32
             * whatever the flag (device.c: CUBLAS_DEFAULT_MATH, PyTorch's default matmul) — the help
             * once said "convolutions and matmuls", mapping it to matmul.allow_tf32 = False too */
            if (!strcmp(o->name, "no-tf32"))
                ck_assert_msg(strstr(o->help, "cudnn.allow_tf32 = False") && !strstr(o->help, "and matmuls") &&
                                  !strstr(o->help, "= torch.backends.cuda.matmul.allow_tf32 = False"),
                              "--no-tf32's help: %s", o->help);
        }
        free(t);
        ck_assert(strstr(out, "--gpus"));
        /* defaults as before parsing (--lr 0.5 came first but must not show as the default) */
        ck_assert_msg(strstr(out, "default 0.1 "), "help should show lr's default 0.1:\n%s", out);
        ck_assert(strstr(out, "default 128 "));
        ck_assert(strstr(out, "default cosine "));
        ck_assert(strstr(out, "--data DIR"));
        ck_assert(strstr(out, "--resume FILE"));
        ck_assert(strstr(out, "--norm bn|none"));
        ck_assert(strstr(out, "cudnn.benchmark = True"));
        free(out);
    }
}
END_TEST

/* A CIFAR-10 directory that --data accepts: the six files, `records` records each (label 0). */
static void write_cifar_dir(const char *dir, int records) {
    for (int k = 0; k < CIFAR10_FILES; k++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, cifar10_file_names[k]);
        FILE *g = fopen(path, "wb");
        ck_assert_ptr_nonnull(g);
        for (long b = 0; b < 3073L * records; b++) fputc(0, g);
        fclose(g);
    }
}

static void remove_cifar_dir(const char *dir) {
    for (int k = 0; k < CIFAR10_FILES; k++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, cifar10_file_names[k]);
        unlink(path);
    }
}

/* Defaults as documented in cli.h. */
START_TEST(test_defaults_and_resolve) {
    TrainConfig c;
    config_defaults(&c);
    ck_assert_str_eq(c.device, "auto");
    ck_assert_str_eq(c.model, "");
    ck_assert_str_eq(c.norm, "bn");
    ck_assert_int_eq(c.epochs, -1);
    ck_assert_int_eq(c.steps, 0);
    ck_assert_int_eq(c.batch_size, 128);
    ck_assert(c.lr == 0.1 && c.momentum == 0.9 && c.weight_decay == 5e-4);
    ck_assert_str_eq(c.schedule, "cosine");
    ck_assert_int_eq(c.seed, 0);
    ck_assert_int_eq(c.log_every, 50);
    ck_assert_int_eq(c.deterministic + c.cudnn_benchmark + c.no_tf32 + c.pin_memory, 0);
    ck_assert_str_eq(c.data, "");
    ck_assert_int_eq(c.train_size, -1);
    ck_assert_int_eq(c.test_size, -1);
    ck_assert_int_eq(c.workers, 2);
    ck_assert_str_eq(c.save, "");
    ck_assert_str_eq(c.resume, "");
    ck_assert_str_eq(c.report, "");
    ck_assert_str_eq(c.progress, "auto");

    config_resolve(&c, 1, 0);
    ck_assert_str_eq(c.model, "resnet18");
    ck_assert_int_eq(c.epochs, 5);
    ck_assert_int_eq(c.train_size, 50000);
    ck_assert_int_eq(c.test_size, 10000);
    ck_assert_str_eq(c.device, "cuda");

    config_defaults(&c);
    config_resolve(&c, 0, 0);
    ck_assert_str_eq(c.model, "tiny");
    ck_assert_int_eq(c.epochs, 4);
    ck_assert_int_eq(c.train_size, 8192);
    ck_assert_int_eq(c.test_size, 1024);
    ck_assert_str_eq(c.device, "cpu");

    /* explicit values are kept; CIFAR-10 keeps −1 = "all of it" */
    config_defaults(&c);
    c.model = "tiny";
    c.epochs = 3;
    char *data = test_tmpdir();
    write_cifar_dir(data, 7);
    c.data = data;
    c.test_size = 7;
    config_resolve(&c, 1, 0);
    ck_assert_str_eq(c.model, "tiny");
    ck_assert_int_eq(c.epochs, 3);
    ck_assert_int_eq(c.train_size, -1);
    ck_assert_int_eq(c.test_size, 7);
    remove_cifar_dir(data);
    free(data);
}
END_TEST

START_TEST(test_resolve_paths) {
    char dir[] = "/tmp/test_cli_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char file[128], missing[128], report_missing[160], report_ok[128];
    snprintf(file, sizeof file, "%s/a.ckpt", dir);
    snprintf(missing, sizeof missing, "%s/missing.ckpt", dir);
    snprintf(report_missing, sizeof report_missing, "%s/no/such/dir/r.jsonl", dir);
    snprintf(report_ok, sizeof report_ok, "%s/r.jsonl", dir);
    test_write_ckpt_header_only(file); /* a checkpoint as far as the flag checks read it */

    REFUSED(A("--resume", missing), "--resume", missing);
    /* a file that is no checkpoint: refused here, with the other flags, not after the run header and the
     * model (checkpoint_load's words) */
    char other[160];
    snprintf(other, sizeof other, "%s/notes.txt", dir);
    test_write_text(other, "x");
    REFUSED(A("--resume", other), other, "is not a checkpoint of this trainer", "expected a file written by --save");
    test_write_text(other, "");
    REFUSED(A("--resume", other), other, "is empty, not a checkpoint", "give --resume a file written by --save");
    test_write_text(other, "DPDDPCKP\x09");
    REFUSED(A("--resume", other), other, "is truncated", "less than a checkpoint's header");
    unlink(other);
    REFUSED(A("--resume", dir), "--resume", "is a directory, and holds no checkpoint", "give a checkpoint file");
    /* a --save directory (after Ctrl-C, say): its newest checkpoint is named, not an epoch003.ckpt it lacks */
    char ckdir[160], ck[200];
    snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
    snprintf(ck, sizeof ck, "%s/step00000015.ckpt", ckdir);
    ck_assert_int_eq(mkdir(ckdir, 0755), 0);
    test_write_text(ck, "x");
    REFUSED(A("--resume", ckdir), "is a directory: give a checkpoint file in it (the newest: --resume", ck);
    unlink(ck);
    rmdir(ckdir);
    REFUSED(A("--resume", "/dev/null"), "--resume '/dev/null' is not a regular file", "device"); /* not "directory" */
    REFUSED(A("--optimizer", "adam", "--momentum", "0.5"), "--momentum is SGD's", "drop --momentum");
    REFUSED(A("--keep-last", "2"), "--keep-last 2", "give --save DIR too"); /* else silently nothing */
    REFUSED(A("--keep-last", "1"), "--keep-last 1", "give --save DIR too"); /* the smallest: 0 is "keep all" */
    REFUSED(A("--data", missing), "--data", missing, "docs/get_cifar10.sh", "drop --data to use the synthetic set");
    /* a path of 5000 characters: the message still reaches its fix (it used to stop at 4 KiB) */
    char *long_path = malloc(5001);
    memset(long_path, 'd', 5000);
    long_path[0] = '/', long_path[5000] = 0;
    REFUSED(A("--data", long_path), "--data", "(give the directory that holds data_batch_1.bin");
    free(long_path);
    REFUSED(A("--data", file), "--data", "not a directory");
    REFUSED(A("--report", report_missing), "--report", "does not exist");
    /* a directory that takes no file (/proc does not, even for root): stages 3–5 found it after the launch */
    REFUSED(A("--report", "/proc/r.jsonl"), "--report '/proc/r.jsonl': cannot create a file in directory '/proc'",
            "give --report a path in a directory you can write (e.g. ./r.jsonl)");
    REFUSED(A("--report", dir), "--report", "is a directory");
    REFUSED(A("--save", file), "--save", "not a directory");

    /* --data: a directory without the files, refused once here (not once per worker), naming the file */
    char data[160], batch1[200];
    snprintf(data, sizeof data, "%s/data", dir);
    ck_assert_int_eq(mkdir(data, 0755), 0);
    snprintf(batch1, sizeof batch1, "%s/data_batch_1.bin", data);
    REFUSED(A("--data", data), batch1, "not found");
    /* the good versions pass: --data with six one-record files */
    write_cifar_dir(data, 1);
    REFUSED(A("--data", data, "--test-size", "2"), "asked for 2 test samples", "lower --test-size");
    const char *ok[] = {"--resume", file, "--data", data, "--report", report_ok, "--save", dir, NULL};
    ParseJob j = {ok, 1, 0};
    char *out = NULL;
    int st = test_run_captured(parse_child, &j, &out);
    ck_assert_msg(st == 0, "valid paths refused (%d): %s", st, out);
    free(out);
    const char *rel[] = {"--report", "relative.jsonl", NULL};
    j.args = rel;
    st = test_run_captured(parse_child, &j, &out);
    ck_assert_msg(st == 0, "a report in the current directory refused (%d): %s", st, out);
    free(out);

    remove_cifar_dir(data);
    rmdir(data);
    unlink(file);
    rmdir(dir);
}
END_TEST

static void accepted(const char *const *args) {
    ParseJob j = {args, 1, 0};
    char *out = NULL;
    int st = test_run_captured(parse_child, &j, &out);
    ck_assert_msg(st == 0, "'%s %s …' refused (%d): %s", args[0], args[1], st, out);
    free(out);
}
#define ACCEPTED(...) accepted((const char *const[]){__VA_ARGS__, NULL})

/* --report files are emptied at the start, --trace files replaced at the end: a FIFO (which used to hang --trace forever), a
 * directory (stages 3–5 used to find out after training, at the merge), the --resume checkpoint or
 * each other (both used to be truncated or interleaved), or any checkpoint are refused before. */
START_TEST(test_resolve_output_files) {
    char *dir = test_tmpdir(), fifo[300], ck[300], alias[300], same[512], out[512], sub[300], rank[300], sub2[300];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    REFUSED(A("--trace", fifo), "--trace", fifo, "is a FIFO: give it a regular file");
    REFUSED(A("--report", fifo), "--report", "is a FIFO");
    REFUSED(A("--trace", dir), "--trace", "is a directory", "trace.json");
    /* a file where the directory should be: not "does not exist (create it first: mkdir -p …)", which
     * mkdir refuses */
    snprintf(out, sizeof out, "%s/plain", dir);
    test_write_text(out, "a file\n");
    snprintf(sub, sizeof sub, "%s/plain/r.json", dir);
    REFUSED(A("--report", sub), "--report", "is a file, not a directory");
    REFUSED(A("--trace", sub), "--trace", "is a file, not a directory");
    unlink(out);
    /* a missing directory is named with its mkdir — unless it is --save's, which the run creates anyway */
    snprintf(sub, sizeof sub, "%s/new/r.json", dir);
    snprintf(sub2, sizeof sub2, "%s/new/", dir);
    REFUSED(A("--report", sub), "--report", "does not exist (create it first: mkdir -p");
    REFUSED(A("--report", sub, "--save", dir), "--report", "does not exist");
    ACCEPTED("--report", sub, "--save", sub2);
    snprintf(sub2, sizeof sub2, "%s/new", dir);
    struct stat made;
    ck_assert_int_eq(stat(sub2, &made), 0);
    ck_assert(S_ISDIR(made.st_mode));
    ck_assert_int_eq(rmdir(sub2), 0);
    snprintf(out, sizeof out, "%s/t.json", dir);
    snprintf(rank, sizeof rank, "%s/t.json.rank12.json", dir); /* stages 3–5: rank 12's file */
    ck_assert_int_eq(mkdir(rank, 0700), 0);
    REFUSED(A("--trace", out), "--trace", rank, "is a directory: remove it");
    ck_assert_int_eq(rmdir(rank), 0);
    snprintf(rank, sizeof rank, "%s/t.json.rank1.json", dir);
    ck_assert_int_eq(mkfifo(rank, 0600), 0);
    REFUSED(A("--trace", out), "--trace", rank, "is a FIFO");
    unlink(rank);
    snprintf(rank, sizeof rank, "%s/t.json.rankX.json", dir); /* not a rank file's name */
    ck_assert_int_eq(mkdir(rank, 0700), 0);
    ACCEPTED("--trace", out);
    /* a checkpoint (its magic, whatever follows) is never a --report or --trace */
    snprintf(ck, sizeof ck, "%s/epoch001.ckpt", dir);
    test_write_text(ck, "DPDDPCKP and the rest of a checkpoint");
    REFUSED(A("--report", ck), "--report", ck, "is a checkpoint", "give --report another file name");
    REFUSED(A("--trace", ck), "--trace", "is a checkpoint");
    /* the same file under two flags: the same inode (a hard link), or the same new path spelled twice
     * (the checkpoint's whole header now: --resume's own check reads that far) */
    test_write_ckpt_header_only(ck);
    snprintf(alias, sizeof alias, "%s/alias", dir);
    ck_assert_int_eq(link(ck, alias), 0);
    REFUSED(A("--report", alias, "--resume", ck), "--report", "--resume", "same file",
            "destroy the checkpoint before it is read");
    REFUSED(A("--resume", alias, "--trace", ck), "--trace", "--resume", "same file");
    snprintf(sub, sizeof sub, "%s/sub", dir);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    snprintf(same, sizeof same, "%s/sub/../r.out", dir);
    snprintf(out, sizeof out, "%s/r.out", dir);
    REFUSED(A("--report", out, "--trace", same), "--report", "--trace", "same file", "corrupting the other");
    test_write_text(out, "an earlier report\n");
    REFUSED(A("--report", same, "--trace", out), "same file");
    snprintf(same, sizeof same, "%s/sub/t.json", dir);
    ACCEPTED("--report", out, "--trace", same, "--resume", ck);
    ACCEPTED("--report", "/dev/null", "--trace", "/dev/null"); /* a device takes any number of writers */
    /* not yet a checkpoint, but the name of one that --save will write there (or of its .tmp): the save
     * used to rename its checkpoint over the report, or write into it while the report was open */
    snprintf(out, sizeof out, "%s/epoch002.ckpt.tmp", sub);
    REFUSED(A("--save", sub, "--report", out), "--report", "name of a checkpoint that --save", "report.jsonl");
    snprintf(out, sizeof out, "%s/sub/../sub/step00000003.ckpt", dir);
    REFUSED(A("--save", sub, "--trace", out), "--trace", "name of a checkpoint", "trace.json");
    snprintf(sub2, sizeof sub2, "%s/sub2", dir);
    ck_assert_int_eq(mkdir(sub2, 0700), 0);
    ACCEPTED("--save", sub2, "--trace", out);             /* another directory: no save writes there */
    snprintf(out, sizeof out, "%s/report.jsonl", sub);
    ACCEPTED("--save", sub, "--report", out);             /* beside the checkpoints is fine */
    /* a file --data reads: emptying or replacing it used to destroy the dataset */
    write_cifar_dir(sub, 1);
    write_cifar_dir(dir, 1);
    snprintf(out, sizeof out, "%s/test_batch.bin", sub);
    REFUSED(A("--data", sub, "--report", out), "--report", "which --data reads", "destroy the dataset");
    snprintf(same, sizeof same, "%s/data_batch_3.bin", sub);
    REFUSED(A("--data", sub, "--trace", same), "--trace", "which --data reads");
    /* the name of one anywhere, with --data elsewhere or none: a synthetic run used to overwrite the set */
    REFUSED(A("--data", dir, "--report", out), "--report", "name of a CIFAR-10 file", "another file name");
    REFUSED(A("--trace", same), "--trace", "name of a CIFAR-10 file");
    snprintf(out, sizeof out, "%s/test_batch.bin.json", sub);
    ACCEPTED("--report", out);
    free(dir);
}
END_TEST

/* --evaluate refuses the flags only training reads: every flag of every stage must be in one of
 * cli.c's two lists, so a new flag cannot slip past as silently ignored (the stages' own --help is
 * the list of flags). */
START_TEST(test_every_flag_is_classified_for_evaluate) {
    int flags = 0;
    for (int s = 1; s <= 5; s++) {
        char cmd[600], *out;
        snprintf(cmd, sizeof cmd, "%s/stage%d --help", test_root(), s);
        ck_assert_int_eq(test_run(cmd, &out), 0);
        for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
            char name[64];
            if (sscanf(line, "  --%63[a-z0-9-]", name) != 1) continue;
            ck_assert_msg(cli_evaluate_keeps(name) >= 0, "stage%d's --%s is in neither of cli.c's --evaluate lists "
                          "(evaluate_keeps: it changes the model, its forward or the test; evaluate_refuses: only "
                          "training reads it)", s, name);
            flags++;
        }
        free(out);
    }
    ck_assert_int_ge(flags, 5 * 30); /* the --help lines were read */
    ck_assert_int_eq(cli_evaluate_keeps("lr"), 0);
    ck_assert_int_eq(cli_evaluate_keeps("test-size"), 1);
    ck_assert_int_eq(cli_evaluate_keeps("no-such-flag"), -1);
}
END_TEST

/* An unknown flag that another stage has is named with that stage (cli_flag_stages): the table in
 * cli.c must be exactly the stages' --help, both ways — every flag some stages lack is in it, under
 * the stages that have it — and each stage refuses another stage's flag naming where it lives. */
START_TEST(test_other_stages_flags_are_named) {
    enum { MAXF = 256 };
    char names[MAXF][64];
    int has[MAXF] = {0}, n = 0; /* has[i]: bit s set when stage s lists names[i] */
    for (int s = 1; s <= 5; s++) {
        char cmd[600], *out;
        snprintf(cmd, sizeof cmd, "%s/stage%d --help", test_root(), s);
        ck_assert_int_eq(test_run(cmd, &out), 0);
        for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
            char name[64]; /* a flag's row: two spaces, then --name (not a continuation line's --word) */
            if (strncmp(line, "  --", 4) || sscanf(line + 4, "%63[a-z0-9-]", name) != 1) continue;
            int i = 0;
            while (i < n && strcmp(names[i], name)) i++;
            if (i == n) ck_assert(n < MAXF), snprintf(names[n++], 64, "%s", name);
            has[i] |= 1 << s;
        }
        free(out);
    }
    ck_assert_int_ge(n, 60);
    int others = 0;
    for (int i = 0; i < n; i++) {
        char want[16] = "";
        int lo = 0, hi = 0;
        for (int s = 1; s <= 5; s++)
            if (has[i] >> s & 1) hi = s, lo = lo ? lo : s;
        if (has[i] != 0x3e) { /* not every stage's: the stages that have it, one or a run */
            ck_assert_msg(has[i] == ((1 << (hi + 1)) - (1 << lo)), "--%s: its stages are not a run", names[i]);
            snprintf(want, sizeof want, lo == hi ? "%d" : "%d–%d", lo, hi);
            others++;
        }
        const char *got = cli_flag_stages(names[i], NULL);
        ck_assert_msg(want[0] ? got && !strcmp(got, want) : got == NULL, "--%s: cli.c says stages %s, --help says %s",
                      names[i], got ? got : "(all)", want[0] ? want : "(all)");
        if (!want[0]) continue;
        int other = lo > 1 ? 1 : hi + 1; /* a stage without it */
        char cmd[600], *out;
        snprintf(cmd, sizeof cmd, "%s/stage%d --%s 1", test_root(), other, names[i]);
        ck_assert_int_eq(test_run(cmd, &out), 2);
        char expect[200];
        snprintf(expect, sizeof expect, "error: --%s is a flag of stage%s %s (", names[i], lo == hi ? "" : "s", want);
        ck_assert_msg(strstr(out, expect) && strstr(out, "not of stage"), "%s\n%s", cmd, out);
        free(out);
    }
    ck_assert_int_ge(others, 40);
    /* --epoch (the sampler lesson's) given to stage 1 is most likely --epochs mistyped: both are named */
    char cmd[600], *out;
    snprintf(cmd, sizeof cmd, "%s/stage1 --epoch 3", test_root());
    ck_assert_int_eq(test_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--epoch is a flag of stages 3–5") && strstr(out, "or did you mean --epochs?"), "%s", out);
    free(out);
    /* --gpus given to DDP means its worker count: stage 3's own flag is named, not only stage 2 */
    snprintf(cmd, sizeof cmd, "%s/stage3 --gpus 2", test_root());
    ck_assert_int_eq(test_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--gpus is a flag of stage 2") && strstr(out, "not of stage3, which runs a worker process per GPU: --nproc-per-node N"),
                  "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s/stage2 --nproc-per-node 2", test_root());
    ck_assert_int_eq(test_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "not of stage2, which runs a replica thread per GPU: --gpus N"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s/stage1 --gpus 2", test_root()); /* stage 1 has neither: the stage alone */
    ck_assert_int_eq(test_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "run ./stage2") && !strstr(out, "which runs"), "%s", out);
    free(out);
    /* a choice typed as a flag: `--cpu` is --device cpu (it used to suggest --cpu-threads) */
    static const char *const as_flag[][2] = {{"1 --cpu", "did you mean --device cpu?"},
                                             {"1 --tiny", "did you mean --model tiny?"},
                                             {"5 --adam", "did you mean --optimizer adam?"},
                                             {"1 --off", "(see --help for the list)"}};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "%s/stage%s", test_root(), as_flag[i][0]);
        ck_assert_int_eq(test_run(cmd, &out), 2);
        ck_assert_msg(strstr(out, as_flag[i][1]), "%s\n%s", cmd, out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "%s/stage1 --amp bf16", test_root()); /* nothing close: the stage alone */
    ck_assert_int_eq(test_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "run ./stage5") && !strstr(out, "did you mean"), "%s", out);
    free(out);
    ck_assert_ptr_null(cli_flag_stages("lr", NULL));
    ck_assert_ptr_null(cli_flag_stages("no-such-flag", NULL));
}
END_TEST

/* Without a GPU the stages say "(small model, small dataset)": true of the defaults, but not of a run given
 * --data, which trains on every image there (50 000 of CIFAR-10: 8 minutes on 2 cores, where the note
 * promised a small dataset), nor of --model resnet18. The note says what runs, and how to take fewer. */
START_TEST(test_cpu_fallback_note_says_what_runs) {
    TrainConfig c;
    parse_into(&c, (const char *const[]){NULL});
    ck_assert_str_eq(cli_cpu_fallback_what(), "small model, small dataset");
    parse_into(&c, (const char *const[]){"--model", "tiny", "--train-size", "512", NULL});
    ck_assert_str_eq(cli_cpu_fallback_what(), "small model, small dataset");
    parse_into(&c, (const char *const[]){"--data", "data/cifar-10-batches-bin", NULL});
    ck_assert_msg(strstr(cli_cpu_fallback_what(), "small model, every image of --data") &&
                      strstr(cli_cpu_fallback_what(), "--train-size N takes fewer"),
                  "%s", cli_cpu_fallback_what());
    parse_into(&c, (const char *const[]){"--data", "d", "--train-size", "1024", NULL});
    ck_assert_str_eq(cli_cpu_fallback_what(), "small model, --train-size images of --data");
    parse_into(&c, (const char *const[]){"--model", "resnet18", NULL});
    ck_assert_msg(strstr(cli_cpu_fallback_what(), "ResNet-18") && strstr(cli_cpu_fallback_what(), "small dataset"),
                  "%s", cli_cpu_fallback_what());
}
END_TEST

/* Ctrl-C on a run that saves prints how to go on. "continue with --resume X" alone was read as a command of
 * its own: `./stage1 --resume X` meets the defaults (--batch-size 128, 8192 images) and is refused one flag
 * at a time; the line says the resume is this same command with --resume added. */
START_TEST(test_ctrl_c_says_to_resume_with_the_same_command) {
    char dir[64] = "/tmp/test_ctrl_c_XXXXXX", cmd[2048], *out;
    ck_assert_ptr_nonnull(mkdtemp(dir));
    /* plain timeout passes the SIGINT on twice (to its child, then to its process group): one request
     * (stop.c), not a second Ctrl-C that stops the run unsaved, as it did now and then before */
    snprintf(cmd, sizeof cmd, "D=%s; env --default-signal=INT timeout 120 %s/stage1 --device cpu --train-size 512 "
             "--test-size 64 --batch-size 32 --epochs 1000 --progress off --save $D/a > $D/a.log 2>&1 & run=$!; "
             "while ! grep -qs 'saved checkpoint' $D/a.log && kill -0 $run 2>/dev/null; do sleep 0.05; done; "
             "kill -INT $run; wait $run; echo \"exit $?\"; cat $D/a.log; rm -rf $D", dir, test_root());
    test_run(cmd, &out);
    ck_assert_msg(strstr(out, "exit 130") && strstr(out, "stopped early by SIGINT after step ") &&
                      strstr(out, " (added to this same command, its other flags unchanged)"), "%s", out);
    free(out);
}
END_TEST

/* A --data directory that is not there is answered with the download script — by a path that runs from
 * where the student is: from another directory `docs/get_cifar10.sh` is not there, the one next to the
 * binary is. */
START_TEST(test_missing_data_names_a_script_that_runs_from_here) {
    char root[PATH_MAX], cmd[PATH_MAX + 200], want[PATH_MAX + 100], *out;
    ck_assert_ptr_nonnull(realpath(test_root(), root));
    snprintf(cmd, sizeof cmd, "cd / && %s/stage1 --device cpu --data no_such_data_dir", root);
    ck_assert_int_eq(test_run(cmd, &out), 2);
    snprintf(want, sizeof want, "download CIFAR-10 into it with %s/docs/get_cifar10.sh no_such_data_dir", root);
    ck_assert_msg(strstr(out, want), "%s\n%s", cmd, out);
    free(out);
    snprintf(cmd, sizeof cmd, "cd %s && ./stage1 --device cpu --data no_such_data_dir", root); /* from the root */
    ck_assert_int_eq(test_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "with docs/get_cifar10.sh no_such_data_dir"), "%s\n%s", cmd, out);
    free(out);
}
END_TEST

/* `./stage5 --help | head` is how help gets read: the reader leaves early, and the help ends quietly
 * (SIGPIPE, exit 141, as any tool), not with the training run's "stopped — the program reading its
 * output went away … the checkpoints already saved are intact" note, which it printed. */
START_TEST(test_help_into_a_closed_pipe_is_quiet) {
    for (int k = 1; k <= 5; k += 2) {
        char cmd[700], *out;
        /* stdout into `true`, gone before the help is written; stderr and the exit status to fd 3 */
        snprintf(cmd, sizeof cmd, "{ { sleep 0.3; timeout 30 %s/stage%d --help 2>&3; echo \"exit $?\" >&3; } | true; } 3>&1",
                 test_root(), k);
        test_run(cmd, &out);
        ck_assert_msg(strstr(out, "exit 141") && !strstr(out, "stopped"), "stage%d --help | head:\n%s", k, out);
        free(out);
    }
}
END_TEST

/* A fresh run into a --save directory that holds another run's checkpoints used to overwrite them:
 * refused, naming the newest to --resume; resuming one of them there is fine, one from elsewhere not. */
START_TEST(test_resolve_save_holding_checkpoints) {
    char *dir = test_tmpdir(), path[400], save[200], newest[400];
    snprintf(save, sizeof save, "%s/ckpts", dir);
    ck_assert_int_eq(mkdir(save, 0700), 0);
    /* names checkpoint.c does not write, and a directory under one it does, are no checkpoints */
    const char *not_ckpt[] = {"epoch01.ckpt", "epoch001.ckpt.tmp", "notes.txt", "step1.ckpt"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", save, not_ckpt[i]);
        test_write_text(path, "x");
    }
    snprintf(path, sizeof path, "%s/epoch004.ckpt", save);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    ACCEPTED("--save", save);
    snprintf(path, sizeof path, "%s/epoch001.ckpt", save); /* a header: --resume's flag check reads it */
    test_write_ckpt_header_only(path);
    snprintf(newest, sizeof newest, "%s/step00000020.ckpt", save);
    test_write_ckpt_header_only(newest);
    struct timespec old[2] = {{1000, 0}, {1000, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, old, 0), 0); /* written before step00000020.ckpt */
    char fix[500];
    snprintf(fix, sizeof fix, "--resume %s", newest);
    REFUSED(A("--save", save), "--save", "already holds 2 checkpoints", fix, "another directory", "delete them");
    /* the resume flow: continue one of them, writing into the same directory (whether it would write
     * over a later one is known once the checkpoint is read: test_resume) */
    ACCEPTED("--save", save, "--resume", path);
    snprintf(fix, sizeof fix, "%s/../ckpts//", save); /* another spelling of it */
    ACCEPTED("--save", fix, "--resume", newest);
    snprintf(path, sizeof path, "%s/elsewhere.ckpt", dir);
    test_write_ckpt_header_only(path);
    REFUSED(A("--save", save, "--resume", path), "--save", "--resume", "is not one of them", newest);
    free(dir);
}
END_TEST

/* ----------------------------------------------------------------------------------------------
 * report.c */

START_TEST(test_json_lines) {
    char dir[] = "/tmp/test_report_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    Report r;
    report_open(&r, path, "off", 1);
    json_begin(&r, "step");
    json_int(&r, "step", -12);
    json_num(&r, "loss", 0.1f);
    json_num(&r, "bad", NAN);
    json_num(&r, "big", -INFINITY);
    json_str(&r, "s", "q\"b\\n\nt\tc\x01\x1f\r\b\fé");
    json_str(&r, "nul", NULL);
    /* valid UTF-8 passes through; a Latin-1 é, a stray continuation, an overlong '/', a surrogate and
     * a sequence cut short become one U+FFFD per byte, so a strict UTF-8 reader can parse the line; so
     * does a lead byte past U+10FFFF's (0xf5: no code point starts with it) */
    json_str(&r, "u", "\xe2\x82\xac\xf0\x9f\x98\x80|\xe9|\x80|\xc0\xaf|\xed\xa0\x80|\xf5\x80\x80\x80|\xe2\x82");
    const int64_t il[] = {1, -2, 3000000000LL};
    const double dl[] = {0.5, INFINITY, 1e-300};
    json_int_list(&r, "il", il, 3);
    json_num_list(&r, "dl", dl, 3);
    json_num_list(&r, "empty", dl, 0);
    json_end(&r);
    json_begin(&r, "epoch");
    json_end(&r);
    report_close(&r);
    char *s = test_slurp(path, NULL);
    ck_assert_ptr_nonnull(s);
    const char *want = "{\"type\":\"step\",\"step\":-12,\"loss\":0.100000001,\"bad\":null,\"big\":null,"
                       "\"s\":\"q\\\"b\\\\n\\nt\\tc\\u0001\\u001f\\r\\b\\fé\",\"nul\":null,"
                       "\"u\":\"\xe2\x82\xac\xf0\x9f\x98\x80|\\ufffd|\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd|"
                       "\\ufffd\\ufffd\\ufffd\\ufffd|\\ufffd\\ufffd\","
                       "\"il\":[1,-2,3000000000],\"dl\":[0.5,null,1e-300],\"empty\":[]}\n"
                       "{\"type\":\"epoch\"}\n";
    ck_assert_str_eq(s, want);
    free(s);

    /* an inactive (non-reporting rank) report neither creates the file nor writes anything */
    unlink(path);
    report_open(&r, path, "on", 0);
    json_begin(&r, "step");
    json_int(&r, "x", 1);
    json_end(&r);
    report_printf(&r, "not printed %d\n", 1);
    report_progress(&r, 1, 1, 1, 1, 1, 1.0, &(float){1.0f});
    report_close(&r);
    ck_assert_int_ne(access(path, F_OK), 0);
    /* no path → no file, no crash */
    report_open(&r, "", "off", 1);
    json_begin(&r, "step");
    json_end(&r);
    report_close(&r);
    report_open(&r, NULL, "off", 1);
    report_close(&r);
    rmdir(dir);
}
END_TEST

/* The edges of well-formed UTF-8 (RFC 3629's table; Unicode 15, table 3-7): the first and last code
 * point of each lead byte's range pass through as they are, and the byte sequence just past each edge
 * (an overlong U+07FF or U+FFFF, a surrogate, a code point past U+10FFFF) becomes one U+FFFD per byte.
 * test_json_lines holds one example of each kind; this one holds the boundaries, where a comparison
 * one off (e0 a0, f0 90 and f4 8f refused; f4 90 let through) would make a valid name unreadable or an
 * invalid one unparseable for a strict reader. */
START_TEST(test_json_utf8_edges) {
    char dir[] = "/tmp/test_report_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"\xc2\x80", "\xc2\x80"},                         /* U+0080, the first two-byte */
        {"\xc1\xbf", "\\ufffd\\ufffd"},                     /* U+007F overlong */
        {"\xdf\xbf", "\xdf\xbf"},                         /* U+07FF */
        {"\xe0\xa0\x80", "\xe0\xa0\x80"},                 /* U+0800, the first three-byte */
        {"\xe0\x9f\xbf", "\\ufffd\\ufffd\\ufffd"},           /* U+07FF overlong */
        {"\xed\x9f\xbf", "\xed\x9f\xbf"},                 /* U+D7FF, just below the surrogates */
        {"\xed\xa0\x80", "\\ufffd\\ufffd\\ufffd"},           /* U+D800, the first surrogate */
        {"\xee\x80\x80", "\xee\x80\x80"},                 /* U+E000, just above them */
        {"\xef\xbf\xbf", "\xef\xbf\xbf"},                 /* U+FFFF */
        {"\xf0\x90\x80\x80", "\xf0\x90\x80\x80"},         /* U+10000, the first four-byte */
        {"\xf0\x8f\xbf\xbf", "\\ufffd\\ufffd\\ufffd\\ufffd"}, /* U+FFFF overlong */
        {"\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf"},         /* U+10FFFF, the last code point */
        {"\xf4\x90\x80\x80", "\\ufffd\\ufffd\\ufffd\\ufffd"}, /* U+110000, past it */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Report r;
        report_open(&r, path, "off", 1);
        json_begin(&r, "t");
        char in[32];
        snprintf(in, sizeof in, "a%sz", cases[i].in); /* and the bytes around it pass as they are */
        json_str(&r, "u", in);
        json_end(&r);
        report_close(&r);
        char *s = test_slurp(path, NULL), want[128];
        ck_assert_ptr_nonnull(s);
        snprintf(want, sizeof want, "{\"type\":\"t\",\"u\":\"a%sz\"}\n", cases[i].out);
        ck_assert_msg(!strcmp(s, want), "case %zu: wrote %s, expected %s", i, s, want);
        free(s);
    }
    unlink(path);
    rmdir(dir);
}
END_TEST

/* %.9g must read back to the identical float32, for normal, subnormal and extreme values. */
START_TEST(test_json_float_roundtrip) {
    char dir[] = "/tmp/test_report_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    enum { N = 20000 };
    static float v[N];
    for (int i = 0; i < N; i++) { /* every finite bit pattern is fair game, subnormals included */
        uint32_t u = (uint32_t)splitmix64((uint64_t)i);
        if ((u & 0x7f800000u) == 0x7f800000u) u &= ~0x00800000u; /* not inf/nan */
        memcpy(&v[i], &u, 4);
    }
    v[0] = 1.40129846e-45f; /* smallest subnormal */
    v[1] = 3.4028234663852886e38f;
    v[2] = 1.17549435e-38f;
    v[3] = 0.1f;
    v[4] = -0.0f;
    Report r;
    report_open(&r, path, "off", 1);
    for (int i = 0; i < N; i++) {
        json_begin(&r, "v");
        json_num(&r, "x", v[i]);
        json_end(&r);
    }
    report_close(&r);
    FILE *f = fopen(path, "r");
    char line[128];
    int i = 0;
    while (fgets(line, sizeof line, f)) {
        const char *x = strstr(line, "\"x\":");
        ck_assert_ptr_nonnull(x);
        float back = strtof(x + 4, NULL);
        ck_assert_msg(memcmp(&back, &v[i], 4) == 0, "%.9g did not round-trip: %s", (double)v[i], line);
        i++;
    }
    fclose(f);
    ck_assert_int_eq(i, N);
    unlink(path);
    rmdir(dir);
}
END_TEST

START_TEST(test_median_and_bytes) {
    double a[] = {5, 1, 4, 2, 3};
    ck_assert(stats_median(a, 5) == 3);
    double b[] = {10, -1, 7, 3};
    ck_assert(stats_median(b, 4) == 5);
    double c[] = {42};
    ck_assert(stats_median(c, 1) == 42);
    ck_assert(stats_median(NULL, 0) == 0);
    const double d[] = {9, 2, 7, 4}; /* the copying median leaves its input as it was */
    ck_assert(stats_median_copy(d, 4) == 5.5);
    ck_assert(d[0] == 9 && d[1] == 2 && d[2] == 7 && d[3] == 4);
    ck_assert(stats_median_copy(d, 3) == 7);
    ck_assert(stats_median_copy(NULL, 0) == 0);
    char buf[32];
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 0), "0 B");
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 512), "512 B");
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 1023), "1023 B");
    /* each unit from its first byte on: 1024 B is 1 KiB, 1024 KiB is 1 MiB (not "1024 B", "1024.00 KiB") */
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 1024), "1.00 KiB");
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 1048576), "1.00 MiB");
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 1073741824.0), "1.00 GiB");
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 1536), "1.50 KiB");
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 3.21 * 1048576), "3.21 MiB");
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 1.07 * 1073741824.0), "1.07 GiB");
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 2.5 * 1099511627776.0), "2.50 TiB");
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 3 * 1125899906842624.0), "3.00 PiB");
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, 2048 * 1125899906842624.0), "2048.00 PiB"); /* the largest unit */
    ck_assert_str_eq(fmt_bytes(buf, sizeof buf, -1536), "-1.50 KiB");
}
END_TEST

static void progress_child(void *arg) {
    const float one = 1.0f;
    Report r;
    report_open(&r, NULL, "on", 1);
    report_progress(&r, 2, 5, 120, 390, 120, 6.0, &(float){1.2345f});
    report_printf(&r, "epoch line\n");
    report_progress(&r, 2, 5, 121, 390, 121, 6.1, &one); /* within 0.1 s: not redrawn */
    report_progress(&r, 2, 5, 390, 390, 390, 6.2, &one); /* but the last always is */
    report_close(&r);
    Report hour; /* a fresh bar (not throttled): one batch of two took an hour, one is left */
    report_open(&hour, NULL, "on", 1);
    report_progress(&hour, 3, 4, 1, 2, 1, 3600.0, &one);
    report_close(&hour);
    Report off;
    report_open(&off, NULL, "off", 1);
    report_progress(&off, 1, 1, 1, 2, 1, 1.0, &one); /* bar disabled: nothing */
    report_printf(&off, "done\n");
    report_close(&off);
    Report first;
    report_open(&first, NULL, "on", 1);
    report_progress(&first, 1, 3, 7, 390, 7, 0.5, NULL); /* no loss read back yet */
    report_close(&first);
    Report nan_loss; /* a diverged loss is shown, not hidden as "not read yet" */
    report_open(&nan_loss, NULL, "on", 1);
    report_progress(&nan_loss, 1, 3, 8, 390, 8, 0.5, &(float){NAN});
    report_close(&nan_loss);
    Report resumed; /* resumed at batch 300 of 390: 10 batches in 1 s, 80 left — not 300 in 1 s */
    report_open(&resumed, NULL, "on", 1);
    report_progress(&resumed, 2, 3, 310, 390, 10, 1.0, &one);
    report_close(&resumed);
}

START_TEST(test_progress_bar) {
    char *out = NULL;
    int st = test_run_captured(progress_child, NULL, &out);
    ck_assert_int_eq(st, 0);
    const char *bar = strstr(out, "epoch 2/5 [");
    ck_assert_msg(bar, "no bar drawn: %s", out);
    ck_assert_msg(strstr(out, "] 120/390  loss 1.2345  ETA 0:14"), "bar text: %s", out);
    /* 24 cells, 120/390 of them filled (7): six '=' and the head */
    ck_assert_msg(strstr(out, "[======>                 ] 120/390"), "bar cells: %s", out);
    ck_assert_msg(strstr(out, "[========================] 390/390"), "the last bar was not drawn: %s", out);
    ck_assert_msg(strstr(out, "epoch 3/4 [===========>            ] 1/2  loss 1.0000  ETA 1:00:00"),
                  "an hour left: %s", out);
    /* the bar was wiped (\r + spaces + \r) right before the printed line */
    const char *line = strstr(out, "\repoch line\n");
    ck_assert_msg(line && line[-1] == ' ', "bar not cleared before output: %s", out);
    ck_assert_msg(!strstr(out, "121/390"), "bar redrawn faster than 10/s: %s", out);
    ck_assert_msg(strstr(out, "done\n") && !strstr(out, "epoch 1/1"), "off bar drawn: %s", out);
    ck_assert_msg(strstr(out, "] 7/390  loss –  ETA"), "a loss not yet read back is not shown as –: %s", out);
    ck_assert_msg(strstr(out, "] 8/390  loss nan  ETA"), "a diverged loss is not shown: %s", out);
    ck_assert_msg(strstr(out, "] 310/390  loss 1.0000  ETA 0:08"), "the ETA of a resumed epoch: %s", out);
    free(out);
}
END_TEST

static void report_open_child(void *arg) {
    Report r;
    report_open(&r, (const char *)arg, "off", 1);
}

static void trace_open_child(void *arg) { trace_configure((const char *)arg, "5:8", 0, 1, "stageX", NULL, 0); }

START_TEST(test_report_open_fails) {
    char *out = NULL;
    int st = test_run_captured(report_open_child, "/nonexistent-dir-xyz/r.jsonl", &out);
    ck_assert_int_eq(st, 2);
    ck_assert_msg(strstr(out, "/nonexistent-dir-xyz/r.jsonl"), "message does not name the path: %s", out);
    ck_assert_msg(!strncmp(out, "error: ", 7) && out[strlen(out) - 1] == '\n', "not one error line: '%s'", out);
    free(out);
    /* a FIFO would block until a reader comes: refused at once, by name */
    char *dir = test_tmpdir(), fifo[600];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    st = test_run_captured(report_open_child, fifo, &out);
    ck_assert_msg(st == 2 && strstr(out, "is a FIFO: give it a regular file") && strstr(out, fifo), "%d: %s", st, out);
    free(out);
    /* open() fails the same way (ENXIO) for what is no FIFO: /dev/tty in a run without a terminal (cron, CI),
     * or a socket — said as it is, not "is a FIFO"; the --trace file too */
    char sock[600];
    snprintf(sock, sizeof sock, "%s/sock", dir);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ck_assert(fd >= 0 && strlen(sock) < sizeof sa.sun_path);
    strcpy(sa.sun_path, sock);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    void (*const child[2])(void *) = {report_open_child, trace_open_child};
    for (int k = 0; k < 2; k++) {
        st = test_run_captured(child[k], sock, &out);
        ck_assert_msg(st == 2 && !strstr(out, "FIFO") && strstr(out, "regular file") && strstr(out, sock), "%s: %d: %s",
                      k ? "--trace" : "--report", st, out);
        free(out);
    }
    close(fd), unlink(sock);
    unlink(fifo), rmdir(dir), free(dir);
}
END_TEST

/* A --report file that exists is emptied before the run writes to it (as torch and `>` do): the new
 * run's lines alone, never the tail of a longer earlier report after them, which would read as records
 * of this run. test_json_lines always wrote to a new file. */
START_TEST(test_report_replaces_an_old_file) {
    char *dir = test_tmpdir(), path[600];
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 100; i++) fprintf(f, "{\"type\":\"step\",\"step\":%d,\"from\":\"an earlier run\"}\n", i);
    fclose(f);
    Report r;
    report_open(&r, path, "off", 1);
    json_begin(&r, "summary");
    json_int(&r, "steps", 3);
    json_end(&r);
    report_close(&r);
    char *s = test_slurp(path, NULL);
    ck_assert_ptr_nonnull(s);
    const char *want = "{\"type\":\"summary\",\"steps\":3}\n";
    ck_assert_msg(!strcmp(s, want), "the file holds %zu bytes, not this run's one line: %.200s…", strlen(s), s);
    free(s);
    unlink(path), rmdir(dir), free(dir);
}
END_TEST

static void report_to_dev_null_child(void *arg) {
    (void)arg;
    Report r;
    report_open(&r, "/dev/null", "off", 1);
    json_begin(&r, "summary");
    json_int(&r, "steps", 3);
    json_end(&r);
    report_close(&r);
    printf("report closed\n");
}

/* --report /dev/null (a character device, as --trace /dev/null: any number of writers) is a place to
 * throw the report away, not an error: report_open takes a regular file or a character device, and
 * refuses FIFOs, sockets and directories (above). test_resolve_output_files accepts the flag, but
 * only report_open opens it. */
START_TEST(test_report_to_dev_null) {
    char *out = NULL;
    int st = test_run_captured(report_to_dev_null_child, NULL, &out);
    ck_assert_msg(st == 0 && strstr(out, "report closed") && !strstr(out, "error"), "exit %d: %s", st, out);
    free(out);
}
END_TEST

static void stdout_fails_child(void *arg) {
    const char *where = arg;
    if (!strcmp(where, "full")) {
        ck_assert_ptr_nonnull(freopen("/dev/full", "w", stdout)); /* every write: ENOSPC, as a full disk */
    } else { /* a pipe whose reader is gone (`stage1 | head`): EPIPE, with SIGPIPE ignored as cli.c does */
        int fd[2];
        ck_assert_int_eq(pipe(fd), 0);
        close(fd[0]);
        signal(SIGPIPE, SIG_IGN);
        dup2(fd[1], STDOUT_FILENO);
    }
    Report r;
    report_open(&r, NULL, "off", 1);
    report_printf(&r, "epoch 1/1: a line that cannot be written\n");
    report_close(&r);
}

/* Lines lost because stdout failed (a full disk, the file-size limit) are said on stderr when the run
 * ends — but not for a reader that went away on purpose (`| head`), whose missing lines are wanted so. */
START_TEST(test_lost_output_is_said_unless_the_reader_left) {
    char *out = NULL;
    int st = test_run_captured(stdout_fails_child, (void *)"full", &out);
    ck_assert_msg(st == 0 && strstr(out, "warning: writing the output (stdout) failed") && strstr(out, "lines are missing"),
                  "stdout on a full device: exit %d, '%s'", st, out);
    free(out);
    st = test_run_captured(stdout_fails_child, (void *)"pipe", &out);
    ck_assert_msg(st == 0 && !strstr(out, "warning"), "stdout to a closed pipe: exit %d, '%s'", st, out);
    free(out);
}
END_TEST

/* A run started with stdout and stderr closed (`>&- 2>&-`, a wrapper that closes them) writes its
 * console lines into no file of its own: the files it opened took descriptors 1 and 2, so the lines
 * went into the --save directory's .lock, the --report file or a checkpoint being written, and
 * stage 3's launcher died of SIGPIPE writing into a socket. */
START_TEST(test_closed_stdout_and_stderr_write_into_no_file) {
    char dir[64] = "/tmp/test_closed_fds_XXXXXX", cmd[1024], *out;
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "R=$(cd %s && pwd) && cd %s && $R/stage1 --device cpu --model tiny --train-size 64 --test-size 32 "
             "--batch-size 16 --epochs 2 --workers 0 --save ck --report r.json >&- 2>&-; echo rc=$?; "
             "wc -l < ck/.lock; grep -vc '^{' r.json; ls ck | wc -l", test_root(), dir);
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(!strcmp(out, "rc=0\n1\n0\n2\n"), "exit, .lock's lines, report lines that are not JSON, "
                  "checkpoints:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s/stage3 --device cpu --model tiny --train-size 64 --test-size 32 --batch-size 16 "
             "--steps 2 --workers 0 --standalone >&- 2>&-; echo rc=$?", test_root());
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(!strcmp(out, "rc=0\n"), "stage3 with stdout and stderr closed: %s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "rm -rf %s/ck %s/r.json && rmdir %s", dir, dir, dir);
    ck_assert_int_eq(test_run(cmd, NULL), 0);
}
END_TEST

/* The allocators that never return NULL (errors.h): xstrndup copies as strndup does; a request no
 * machine can meet ends the run with one error naming the call, its caller's file:line and the
 * bytes — not a NULL dereferenced later (the checkpoint's, --keep-last's and --trace's paths were
 * copied with an unchecked strdup). Under a sanitizer its own
 * allocator reports the request instead, so only the copies are checked there. */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
static void huge_realloc_child(void *arg) {
    (void)arg;
    volatile size_t bytes = (size_t)1 << 62; /* past any x86-64 or aarch64 address space */
    char *p = xrealloc(NULL, bytes);
    p[0] = 1; /* not reached */
}
#endif

/* Halfway between what the kernel would still hand out and the physical memory: malloc itself succeeds
 * there (Linux overcommits up to RAM + swap), and a run that filled the pages was killed with no message
 * (exit 137) — so the allocator refuses first. Only one page is touched if it does not, so the test
 * cannot take the machine's memory. */
static void past_available_child(void *arg) {
    (void)arg;
    double have = host_mem_available(), ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    volatile size_t bytes = (size_t)(have + (ram - have) / 2 + 1073741824.0 * (ram - have < 1e8));
    char *p = xmalloc(bytes);
    p[0] = 1;
    printf("xmalloc of %zu bytes returned\n", (size_t)bytes);
    free(p);
}

static void die_at_child(void *arg) {
    const char *hint = arg;
    die_at("f.c", 7, "open(x)", "No such file", hint);
}

/* die_at prints errors.h's "file:line: call failed: why" and, where the caller knows the fix, a
 * "  hint:" line under it — the one line of an internal failure (an out-of-memory, a thread limit, a
 * CUDA-less build) that tells the user what to do — and exits 1. Only the out-of-memory test below
 * reached die_at, and it checked the first line alone: a hint dropped went unseen. */
START_TEST(test_die_at_prints_its_hint) {
    char *out = NULL;
    int st = test_run_captured(die_at_child, (void *)"lower --workers", &out);
    ck_assert_msg(st == 1 && !strcmp(out, "f.c:7: open(x) failed: No such file\n  hint: lower --workers\n"),
                  "exit %d: '%s'", st, out);
    free(out);
    st = test_run_captured(die_at_child, NULL, &out); /* no hint known: no hint line */
    ck_assert_msg(st == 1 && !strcmp(out, "f.c:7: open(x) failed: No such file\n"), "exit %d: '%s'", st, out);
    free(out);
    st = test_run_captured(die_at_child, (void *)"", &out);
    ck_assert_msg(st == 1 && !strcmp(out, "f.c:7: open(x) failed: No such file\n"), "exit %d: '%s'", st, out);
    free(out);
}
END_TEST

static void failing_last_words(void) { die_runtime("the last words failed too"); }

static void die_twice_child(void *arg) {
    (void)arg;
    /* a guard, not a measure: a process that hangs ends by SIGALRM (Check's own handler reset), and the
     * test says so */
    signal(SIGALRM, SIG_DFL);
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    sigprocmask(SIG_UNBLOCK, &alrm, NULL);
    alarm(20);
    die_last_words = failing_last_words;
    die_user("the first failure");
}

/* A failure inside the exit itself — here the last words (resume.c's gate sends them over a
 * socket, which can fail) — comes from the thread already leaving: errors.c ends the process at once
 * then, with both messages out. Were it taken for another thread's failure, that thread would wait
 * for an exit that never comes, and the run would hang instead of failing. */
START_TEST(test_failure_while_leaving_ends_the_process) {
    char *out = NULL;
    int st = test_run_captured(die_twice_child, NULL, &out);
    ck_assert_msg(st != 128 + SIGALRM, "a failure in the last words hung the process:\n%s", out);
    ck_assert_msg(st != 0 && st < 128 && strstr(out, "error: the first failure\n") &&
                      strstr(out, "error: the last words failed too\n"),
                  "exit %d:\n%s", st, out);
    free(out);
}
END_TEST

START_TEST(test_allocators_never_return_null) {
    char *a = xstrndup("abcdef", 3), *b = xstrdup("xyz"), *c = xstrndup("ab", 10);
    ck_assert_str_eq(a, "abc");
    ck_assert_str_eq(b, "xyz");
    ck_assert_str_eq(c, "ab");
    free(a), free(b), free(c);
    char *out = NULL;
    int st;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    printf("SKIP: cli: an impossible xrealloc — the sanitizer's allocator reports it itself\n");
#else
    st = test_run_captured(huge_realloc_child, NULL, &out);
    ck_assert_msg(st == 1 && strstr(out, "out of host memory (4611686018427387904 bytes asked for, ") &&
                      strstr(out, "test_cli.c:") && strstr(out, "realloc"),
                  "exit %d: %s", st, out);
    free(out);
#endif
    double have = host_mem_available();
    ck_assert_msg(have > 0 && have <= (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE), "%.0f", have);
    out = NULL;
    st = test_run_captured(past_available_child, NULL, &out);
    ck_assert_msg(st == 1 && strstr(out, "out of host memory (") && strstr(out, " available)") &&
                      strstr(out, "test_cli.c:"),
                  "exit %d: %s", st, out);
    free(out);
}
END_TEST

/* More ranks than the report lists one by one (64): ranks 64 and up used to be added into rank 0's
 * peak memory, so the epoch lines' "peak mem" read 4× any rank's. Every rank holds the same model and
 * batch here, so every peak is about the same; the ranks not listed are counted in a line of their own,
 * and in the largest of all. */
START_TEST(test_peak_memory_of_67_ranks) {
    char *dir = test_tmpdir(), cmd[2048], path[600], *out;
    snprintf(cmd, sizeof cmd, "timeout -k 5 280 %s/stage3 --device cpu --model tiny --train-size 134 --test-size 67 "
             "--batch-size 2 --epochs 1 --progress off --workers 0 --nproc-per-node 67 --master-port %d "
             "--report %s/r.jsonl",
             test_root(), test_free_port(), dir);
    int rc = test_run(cmd, &out);
    size_t len = strlen(out);
    const char *tail = out + (len > 3000 ? len - 3000 : 0); /* 67 ranks' lines are too long for a message */
    ck_assert_msg(rc == 0, "exit %d:\n…%s", rc, tail);
    ck_assert_msg(strstr(out, "peak memory rank 63 ") && !strstr(out, "peak memory rank 64 ") &&
                  strstr(out, "peak memory of 3 more ranks (64–66) not listed; the largest of all 67:"), "…%s", tail);
    free(out);
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    const char *types[] = {"epoch", "summary"};
    for (int t = 0; t < 2; t++) {
        double peaks[70];
        ck_assert_int_eq(test_report_list(path, types[t], "peak_mem_bytes", peaks, 70), 64);
        double lo = peaks[0], hi = peaks[0];
        for (int i = 1; i < 64; i++) lo = peaks[i] < lo ? peaks[i] : lo, hi = peaks[i] > hi ? peaks[i] : hi;
        ck_assert_msg(lo > 0 && hi < 1.5 * lo, "%s: rank peaks from %.0f to %.0f bytes (rank 0: %.0f)", types[t], lo,
                      hi, peaks[0]);
        /* the largest of all 67 (one epoch: the record's first "peak_mem_max_bytes" after its type) */
        char *text = test_slurp(path, NULL), key[] = "\"peak_mem_max_bytes\":";
        char *tag = strstr(text, t ? "\"type\":\"summary\"" : "\"type\":\"epoch\"");
        char *at = tag ? strstr(tag, key) : NULL;
        ck_assert_msg(at, "%s: no %s in the %s record", path, key, types[t]);
        double max = strtod(at + strlen(key), NULL);
        ck_assert_msg(max >= hi && max < 1.5 * lo, "%s: largest %.0f, listed %.0f … %.0f", types[t], max, lo, hi);
        free(text);
    }
    free(dir);
}
END_TEST

/* Every stage's --help fits a 100-column terminal (cli.c's print_wrapped; the stages' own usage text
 * may take a few more): a flag whose name and choices are longer than the name column gets a line of
 * its own instead of widening the column for every flag (--optimizer-overlap's choices once pushed
 * stages 3–5 to 132 columns). A word longer than the help column
 * (DistributedDataParallel(find_unused_parameters=True):) gets a line of its own, and the rest of its
 * text is wrapped, not printed as one 330-character line. */
START_TEST(test_stage_help_is_wrapped) {
    for (int k = 1; k <= 5; k++) {
        char cmd[600], *out;
        snprintf(cmd, sizeof cmd, "timeout 30 %s/stage%d --help", test_root(), k);
        ck_assert_int_eq(test_run(cmd, &out), 0);
        if (k == 5) { /* a flag whose default another flag decides shows "auto", not "on" */
            const char *cl = strstr(out, "  --channels-last "), *eol = cl ? strchr(cl, '\n') : NULL;
            const char *dflt = cl ? strstr(cl, "default auto") : NULL;
            ck_assert_msg(dflt && eol && dflt < eol, "stage5 --help: --channels-last's default:\n%s", out);
            const char *ov = strstr(out, "\n  --optimizer-overlap off|in-backward|after-backward\n");
            ck_assert_msg(ov && !strncmp(ov + 54, "                                default off ", 44),
                          "stage5 --help: --optimizer-overlap's long head is not on a line of its own:\n%s", out);
        }
        for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
            size_t chars = 0;
            for (const char *c = line; *c; c++) chars += ((unsigned char)*c & 0xC0) != 0x80; /* UTF-8 */
            const char *last = strrchr(line, ' ');
            int one_long_word = last && strlen(last + 1) > 40; /* nothing to break it at */
            ck_assert_msg(chars <= 110 || one_long_word, "stage%d --help: a %zu-character line:\n%s", k, chars,
                          line);
        }
        free(out);
    }
}
END_TEST

Suite *suite_cli(void) {
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("parse");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_good_parse);
    tcase_add_test(tc, test_last_wins_flags_choices);
    tcase_add_test(tc, test_bad_numbers);
    tcase_add_test(tc, test_auto_is_a_value_where_it_is_the_default);
    tcase_add_test(tc, test_bad_choices_and_syntax);
    tcase_add_test(tc, test_help);
    tcase_add_test(tc, test_stage_help_is_wrapped);
    tcase_add_test(tc, test_defaults_and_resolve);
    tcase_add_test(tc, test_resolve_paths);
    tcase_add_test(tc, test_resolve_output_files);
    tcase_add_test(tc, test_resolve_save_holding_checkpoints);
    tcase_add_test(tc, test_every_flag_is_classified_for_evaluate);
    tcase_add_test(tc, test_other_stages_flags_are_named);
    tcase_add_test(tc, test_help_into_a_closed_pipe_is_quiet);
    tcase_add_test(tc, test_cpu_fallback_note_says_what_runs);
    tcase_add_test(tc, test_ctrl_c_says_to_resume_with_the_same_command);
    tcase_add_test(tc, test_missing_data_names_a_script_that_runs_from_here);
    suite_add_tcase(s, tc);
    TCase *tr = tcase_create("report");
    tcase_set_timeout(tr, 30);
    tcase_add_test(tr, test_json_lines);
    tcase_add_test(tr, test_json_utf8_edges);
    tcase_add_test(tr, test_json_float_roundtrip);
    tcase_add_test(tr, test_median_and_bytes);
    tcase_add_test(tr, test_progress_bar);
    tcase_add_test(tr, test_report_open_fails);
    tcase_add_test(tr, test_report_replaces_an_old_file);
    tcase_add_test(tr, test_report_to_dev_null);
    tcase_add_test(tr, test_lost_output_is_said_unless_the_reader_left);
    tcase_add_test(tr, test_closed_stdout_and_stderr_write_into_no_file);
    tcase_add_test(tr, test_allocators_never_return_null);
    tcase_add_test(tr, test_die_at_prints_its_hint);
    tcase_add_test(tr, test_failure_while_leaving_ends_the_process);
    suite_add_tcase(s, tr);
    TCase *tm = tcase_create("report_ranks"); /* 67 worker processes on the CPU */
    tcase_set_timeout(tm, 300);
    tcase_add_test(tm, test_peak_memory_of_67_ranks);
    suite_add_tcase(s, tm);
    return s;
}
