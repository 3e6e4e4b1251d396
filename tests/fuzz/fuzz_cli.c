/* fuzz_cli.c — libFuzzer harness: the stages' command lines through what each runs before it
 * starts a worker. By default stage 5's, the largest option table (every common flag, DDP's,
 * accumulation's and AMP's), through cli_parse, amp_check, the scaler lesson and config_resolve;
 * when the first line is "stage2", stage 2's (DataParallel's and the modelled GIL's flags) through
 * cli_parse, config_resolve and dp_config_resolve. The input is an argument list, one argument per
 * line. A refusal (die_user) is an answer; anything else that exits, aborts or trips a sanitizer is a
 * finding. Left out on purpose: --help / -h (they print and exit 0 by design) and the sampler lesson
 * (it prints a line per index, up to --dataset-size of them). Seeds in tests/fuzz/cli/. */
#include <fcntl.h>
#include <string.h>

#include "amp.h"
#include "cli.h"
#include "ddp.h"
#include "dp.h"
#include "fuzz_common.h"

enum { MAX_ARGS = 64 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    static char *text; /* the arguments point into it until the next input */
    static char *argv[MAX_ARGS + 2];
    static int quiet;
    if (!quiet) { /* the scaler lesson prints its trajectory: not the fuzzer's output */
        int fd = open("/dev/null", O_WRONLY);
        if (fd < 0 || dup2(fd, 1) < 0) abort();
        close(fd);
        quiet = 1;
    }
    free(text);
    text = xmalloc(n + 1);
    memcpy(text, data, n);
    text[n] = 0;
    int argc = 0;
    argv[argc++] = "stage5";
    for (char *line = text, *next; line && argc <= MAX_ARGS; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!strcmp(line, "-h") || !strncmp(line, "--help", 6) || !strncmp(line, "--show-sampler", 14)) return 0;
        argv[argc++] = line;
    }
    argv[argc] = NULL;
    int stage2 = argc > 1 && !strcmp(argv[1], "stage2");
    if (stage2) argv[1] = "stage2"; /* argv[0], as the program's name */

    static TrainConfig cfg;
    static DdpFlags f;
    static AmpConfig amp;
    config_defaults(&cfg);
    amp_defaults(&amp, "fp16");
    cfg.accum_steps = 1; /* as stages/stage5_amp/main.c, whose own rows these are */
    const Option accum[] = {{"accum-steps", OPT_INT, &cfg.accum_steps, 1, 65536, NULL, "micro-batches"},
                            {"sync-each-micro-step", OPT_FLAG, &f.sync_each_micro_step, 0, 0, NULL, "the experiment"},
                            {NULL, 0, NULL, 0, 0, NULL, NULL}};
    /* a stage builds its tables once; here each input does, so the last input's go first */
    static Option *tables[3];
    for (int i = 0; i < 3; i++) free(tables[i]), tables[i] = NULL;
    die_user_hook = fuzz_rejected;
    if (!setjmp(fuzz_back)) {
        if (stage2) {
            DpConfig dpc = dp_config_defaults();
            tables[0] = config_options(&cfg, dp_options(&dpc));
            cli_parse(argc - 1, argv + 1, tables[0], "stage2", "fuzz");
            config_resolve(&cfg, 0, 0);
            dp_config_resolve(&dpc, DEV_CPU);
        } else {
            tables[0] = ddp_options(&f, accum);
            tables[1] = amp_options(&amp, tables[0]);
            tables[2] = config_options(&cfg, tables[1]);
            cli_parse(argc, argv, tables[2], "stage5", "fuzz");
            amp_check(&amp);
            if (amp.show_scaler[0]) amp_show_scaler(&amp);
            else {
                TrainConfig check = cfg;
                config_resolve(&check, 0, 0);
            }
        }
    }
    die_user_hook = NULL;
    return 0;
}
