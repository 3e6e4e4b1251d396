/* cli.c — the command-line parser and the shared TrainConfig (see cli.h).
 *
 * One table of Option rows drives parsing, validation and --help, so the help text is the
 * documentation of every flag. Values are parsed strictly: "12x", "1e3" for an integer, "nan", an
 * out-of-range number or a misspelled choice is refused with a message that names the flag, the
 * value and what is allowed (die_user, exit 2) — a typo should never silently train the wrong thing.
 *
 * Open interval ends: Option has only inclusive [min, max]. A bound that is one ulp inside an integer
 * (nextafter(0, +inf) for lr's "(0, 100]") is shown as an open end, so messages read "(0, 100]". */
#include "cli.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>     /* statfs: /proc and /sys pseudo-files */
#include <linux/magic.h> /* PROC_SUPER_MAGIC, SYSFS_MAGIC */
#include <unistd.h>

#include "checkpoint.h" /* checkpoint_is_one, checkpoint_list, checkpoint_name_is_one */
#include "cpu_threads.h" /* CPU_THREADS_MAX */
#include "data.h"        /* cifar10_file_names */
#include "device.h"     /* device_memory_fraction */
#include "errors.h"
#include "hash.h"
#include "model.h" /* model_default_layout */
#include "stop.h" /* stop_coming: a closed stdout during a clean stop */
#include "trace.h"

/* ----------------------------------------------------------------------------------------------
 * formatting helpers */

/* An exact integer bound prints as an integer ("65536", "4294967295"), anything else with %g. */
static void fmt_num(char *buf, size_t len, double v) {
    if (v == floor(v) && fabs(v) < 1e15) snprintf(buf, len, "%.0f", v);
    else snprintf(buf, len, "%g", v);
}

/* "[1, 65536]", "(0, 100]", "[0, 1)". */
static void fmt_range(char *buf, size_t len, double lo, double hi) {
    char a[40], b[40];
    double rlo = round(lo), rhi = round(hi);
    int open_lo = lo != rlo && nextafter(rlo, INFINITY) == lo;
    int open_hi = hi != rhi && nextafter(rhi, -INFINITY) == hi;
    fmt_num(a, sizeof a, open_lo ? rlo : lo);
    fmt_num(b, sizeof b, open_hi ? rhi : hi);
    snprintf(buf, len, "%c%s, %s%c", open_lo ? '(' : '[', a, b, open_hi ? ')' : ']');
}

/* The value placeholder shown in --help: INT, FLOAT, the choices, or for strings the first of
 * DIR / FILE / PATH that the help text mentions (so "--data DIR" reads naturally). */
static const char *opt_metavar(const Option *o) {
    switch (o->kind) {
    case OPT_INT:
    case OPT_INT64: return "INT";
    case OPT_FLOAT: return "FLOAT";
    case OPT_FLAG: return "";
    case OPT_CHOICE: return o->choices;
    case OPT_STR: {
        static const char *names[] = {"DIR", "FILE", "PATH"};
        const char *best = "STR", *best_at = NULL;
        for (int i = 0; i < 3; i++) {
            const char *at = o->help ? strstr(o->help, names[i]) : NULL;
            if (at && (!best_at || at < best_at)) best = names[i], best_at = at;
        }
        return best;
    }
    }
    return "";
}

static int choice_ok(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *p = choices;;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return 1;
        if (!bar) return 0;
        p = bar + 1;
    }
}

/* The default as --help shows it. A number outside its own range, or an empty choice, is an
 * internal "decide later" value (epochs −1, model ""), shown as "auto" (or as the row says). */
static void fmt_default(char *buf, size_t len, const Option *o) {
    switch (o->kind) {
    case OPT_INT: {
        int v = *(const int *)o->dst;
        if (v < o->min || v > o->max) snprintf(buf, len, "%s", o->choices ? o->choices : "auto");
        else snprintf(buf, len, "%d", v);
        break;
    }
    case OPT_INT64: {
        int64_t v = *(const int64_t *)o->dst;
        if ((double)v < o->min || (double)v > o->max) snprintf(buf, len, "%s", o->choices ? o->choices : "auto");
        else snprintf(buf, len, "%lld", (long long)v);
        break;
    }
    case OPT_FLOAT: snprintf(buf, len, "%g", *(const double *)o->dst); break;
    case OPT_FLAG: { /* a negative value: not chosen, another flag decides (stage 5's --channels-last) */
        int v = *(const int *)o->dst;
        snprintf(buf, len, "%s", v < 0 ? "auto" : v ? "on" : "off");
        break;
    }
    case OPT_STR: {
        const char *v = *(const char *const *)o->dst;
        snprintf(buf, len, "%s", v && v[0] ? v : "(none)");
        break;
    }
    case OPT_CHOICE: {
        const char *v = *(const char *const *)o->dst;
        snprintf(buf, len, "%s", v && v[0] && choice_ok(o->choices, v) ? v : "auto");
        break;
    }
    }
}

/* Help text wrapped at word boundaries to HELP_COLS, continuation lines indented to `col`. */
#define HELP_COLS 100
#define NAME_COLS 28 /* a longer "--flag METAVAR" (choices can be long) gets a line of its own */
#define DEFAULT_COLS 22 /* likewise a longer "default VALUE" */
static void print_wrapped(const char *text, int col) {
    int width = HELP_COLS - col < 40 ? 40 : HELP_COLS - col;
    while ((int)strlen(text) > width) {
        int cut = width;
        while (cut > 0 && text[cut] != ' ') cut--;
        if (cut == 0) { /* a word longer than the column: it gets a line of its own, then wrapping goes on */
            const char *sp = strchr(text + width, ' ');
            if (!sp) break;
            cut = (int)(sp - text);
        }
        printf("%.*s\n%*s", cut, text, col, "");
        text += cut + 1;
    }
    printf("%s\n", text);
}

static void cli_print_help(const Option *opts, const char *prog, const char *about) {
    if (about && strstr(about, "usage:")) printf("%s\n", about); /* the stage's own usage lines */
    else {
        printf("usage: %s [options]\n", prog ? prog : "train");
        if (about && about[0]) printf("\n%s\n", about);
    }
    printf("\noptions (--name VALUE or --name=VALUE):\n");
    int w_name = 0, w_def = 0;
    char def[256];
    for (const Option *o = opts; o->name; o++) {
        int n = (int)strlen(o->name) + 2 + (o->kind == OPT_FLAG ? 0 : 1 + (int)strlen(opt_metavar(o)));
        if (n > w_name) w_name = n;
        fmt_default(def, sizeof def, o);
        if ((int)strlen(def) > w_def) w_def = (int)strlen(def);
    }
    if (w_name < 12) w_name = 12;
    if (w_name > NAME_COLS) w_name = NAME_COLS;
    w_def += 8; /* "default " */
    if (w_def > DEFAULT_COLS) w_def = DEFAULT_COLS;
    const int col = 2 + w_name + 2 + w_def + 2; /* where the help text starts: two spaces after the default */
    for (const Option *o = opts; o->name; o++) {
        char head[256], dflt[300];
        snprintf(head, sizeof head, "--%s%s%s", o->name, o->kind == OPT_FLAG ? "" : " ", opt_metavar(o));
        fmt_default(def, sizeof def, o);
        snprintf(dflt, sizeof dflt, "default %s", def);
        if ((int)strlen(head) > w_name) printf("  %s\n  %-*s  ", head, w_name, ""); /* its own line */
        else printf("  %-*s  ", w_name, head);
        if ((int)strlen(dflt) > w_def) printf("%s\n%*s", dflt, col, "");
        else printf("%-*s  ", w_def, dflt);
        print_wrapped(o->help ? o->help : "", col);
    }
    printf("  %-*s  %-*s  %s\n", w_name, "--help, -h", w_def, "", "print this help and exit");
}

/* ----------------------------------------------------------------------------------------------
 * parsing */

/* Levenshtein distance, for "did you mean" (names are short, so O(n·m) on the stack is fine). */
static int edit_distance(const char *a, const char *b) {
    int n = (int)strlen(a), m = (int)strlen(b);
    if (n > 63 || m > 63) return 99;
    int d[64][64];
    for (int i = 0; i <= n; i++) d[i][0] = i;
    for (int j = 0; j <= m; j++) d[0][j] = j;
    for (int i = 1; i <= n; i++)
        for (int j = 1; j <= m; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

/* The closest option name to a misspelled one, or NULL if nothing is close: a unique prefix
 * ("--batch" → batch-size), one edit, or — `loose`, for a typo — two edits (or a third of the name),
 * but two only where the name keeps a letter of its own: '--5' is no typo of '--lr'. */
static const char *closest_option(const Option *opts, const char *name, int loose) {
    size_t len = strlen(name);
    const char *prefix_hit = NULL;
    int n_prefix = 0;
    for (const Option *o = opts; o->name; o++)
        if (len >= 2 && strncmp(o->name, name, len) == 0) prefix_hit = o->name, n_prefix++;
    if (n_prefix == 1) return prefix_hit;
    const char *best = NULL;
    int best_d = 1 << 30;
    for (const Option *o = opts; o->name; o++) {
        int d = edit_distance(name, o->name);
        if (d < best_d) best_d = d, best = o->name;
    }
    if (best && (best_d == 1 || (loose && ((best_d == 2 && (int)len > 2) || best_d * 3 <= (int)len)))) return best;
    return NULL;
}
static const char *suggest(const Option *opts, const char *name) { return closest_option(opts, name, 1); }

static const Option *find_option(const Option *opts, const char *name, size_t len) {
    for (const Option *o = opts; o->name; o++)
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0) return o;
    return NULL;
}

/* The flags only some stages have (each stage adds its idea's flags to stage 1's): an unknown flag
 * found here is named with the stages that have it — `./stage1 --amp bf16` is a flag of stage 5, not
 * a typo to correct. tests/test_cli.c checks the table against every stage's --help, both ways. */
static const struct {
    const char *stages, *idea, *flags; /* flags: space-separated, with a space at each end */
} other_stages[] = {
    {"2", "DataParallel", " gpus gil-switch-ms gil-op-us gil-host-call-us gil-host-module-us gil-host-param-us gil-host-thread-us "
          "gil-host-us dp-plan-us dp-plan-bench-us dp-thread-pool no-python p2p "},
    {"3–5", "DDP", " nproc-per-node nnodes node-rank master-addr master-port standalone comm bucket-mb last-bucket-mb broadcast-buffers "
            "no-overlap optimizer-overlap find-unused-parameters unused-param sync-bn drop-last rdzv-timeout "
            "comm-timeout show-sampler dataset-size world-size rank epoch no-shuffle "},
    {"4–5", "gradient accumulation", " accum-steps sync-each-micro-step "},
    {"5", "mixed precision", " amp channels-last init-scale growth-factor backoff-factor growth-interval no-grad-scaler grad-stats "
          "grad-comm show-scaler test-inf-step "},
};

const char *cli_flag_stages(const char *name, const char **idea) {
    char key[130];
    if (strlen(name) > 120 || strchr(name, ' ')) return NULL;
    snprintf(key, sizeof key, " %s ", name);
    for (size_t i = 0; i < sizeof other_stages / sizeof other_stages[0]; i++)
        if (strstr(other_stages[i].flags, key)) {
            if (idea) *idea = other_stages[i].idea;
            return other_stages[i].stages;
        }
    return NULL;
}

static const char *parsing_prog = "this stage"; /* cli_parse's prog, for die_unknown */

/* This stage's flag that `name` is a near miss of — a unique prefix of it or one edit away (--epoch of
 * --epochs) — or NULL: another stage's flag given here may be that typo rather than the wrong stage. */
static const char *near_miss(const Option *opts, const char *name) { return closest_option(opts, name, 0); }

_Noreturn static void die_unknown(const Option *opts, const char *arg) {
    const size_t dashes = strspn(arg, "-");
    /* -h=1, --help=yes: the help flag, known, with a value it does not take (not "unknown option '-h'") */
    if ((dashes == 1 && !strncmp(arg + 1, "h=", 2)) || (dashes == 2 && !strncmp(arg + 2, "help=", 5)))
        die_user("%.*s is a flag and takes no value, got '%s' (write just %.*s)", (int)strcspn(arg, "="), arg,
                 strchr(arg, '=') + 1, (int)strcspn(arg, "="), arg);
    /* "--", "--=5": no name at all — nothing to correct it to (an empty name is within two edits of "lr") */
    if (arg[dashes] == 0 || arg[dashes] == '=')
        die_user("'%s' names no option: every option is --name VALUE (or --name=VALUE), and there are no other "
                 "arguments for '--' to set apart — see --help for the list", arg);
    if (arg[0] == '-' && arg[1] != '-' && strcspn(arg + 1, "=") == 1) /* -b: one letter says nothing of which flag */
        die_user("unknown option '%.*s': options are long (--name VALUE; only -h is short) — see --help for the "
                 "list", (int)strcspn(arg, "="), arg);
    const char *name = arg;
    while (*name == '-') name++;
    char buf[128];
    size_t len = strcspn(name, "=");
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 120 ? len : 120), name);
    const char *idea, *stages = cli_flag_stages(buf, &idea);
    if (stages) { /* known, but not here: say where it lives, and the flag of this stage it is close to */
        /* the same knob under this stage's idea: DataParallel's GPUs are DDP's worker processes */
        static const char *const same_knob[][3] = {{"gpus", "nproc-per-node", "a worker process per GPU"},
                                                   {"nproc-per-node", "gpus", "a replica thread per GPU"}};
        for (size_t i = 0; i < sizeof same_knob / sizeof same_knob[0]; i++)
            if (!strcmp(buf, same_knob[i][0]) && find_option(opts, same_knob[i][1], strlen(same_knob[i][1])))
                die_user("--%s is a flag of stage%s %s (%s), not of %s, which runs %s: --%s N (./stage%.1s is "
                         "%s)", buf, strstr(stages, "–") ? "s" : "", stages, idea, parsing_prog, same_knob[i][2],
                         same_knob[i][1], stages, idea);
        const char *near = near_miss(opts, buf);
        die_user("--%s is a flag of stage%s %s (%s), not of %s: run ./stage%.1s (see ./stage%.1s --help)%s%s%s", buf,
                 strstr(stages, "–") ? "s" : "", stages, idea, parsing_prog, stages, stages,
                 near ? ", or did you mean --" : "", near ? near : "", near ? "?" : "");
    }
    /* --cpu, --fp16, --adam: a value of one flag's choices, typed as a flag (closer than any name) */
    const Option *owner = NULL;
    int owners = 0;
    for (const Option *o = opts; o->name && !choice_ok("auto|on|off", buf); o++) /* values of many flags: no */
        if (o->kind == OPT_CHOICE && choice_ok(o->choices, buf)) owner = o, owners++;
    if (owners == 1 && !strchr(arg, '='))
        die_user("unknown option '%s' (did you mean --%s %s?)", arg, owner->name, buf);
    const char *s = suggest(opts, buf);
    if (s) die_user("unknown option '%.*s' (did you mean --%s?)", (int)strcspn(arg, "="), arg, s);
    die_user("unknown option '%.*s' (see --help for the list)", (int)strcspn(arg, "="), arg);
}

/* Options whose default --help shows as "auto" (a value decided later: --gpus, --epochs, --model …)
 * take "auto" as a value too, which puts that default back — what the help offers, a user may type
 * (and a script may pass through). Read before any flag is applied, as the help reads them. */
typedef struct AutoDefault {
    int is_auto;
    union { int i; int64_t l; const char *s; } v;
} AutoDefault;
static AutoDefault *auto_defaults;
static const Option *auto_table; /* the table auto_defaults is read from */

static void auto_defaults_read(const Option *opts) {
    int n = 0;
    while (opts[n].name) n++;
    free(auto_defaults);
    auto_table = opts;
    auto_defaults = xcalloc((size_t)n + 1, sizeof *auto_defaults);
    for (int i = 0; i < n; i++) {
        const Option *o = &opts[i];
        char buf[160];
        if (o->kind == OPT_FLAG || o->kind == OPT_FLOAT || o->kind == OPT_STR) continue;
        fmt_default(buf, sizeof buf, o);
        if (strcmp(buf, "auto") || (o->kind == OPT_CHOICE && choice_ok(o->choices, "auto"))) continue; /* a choice */
        auto_defaults[i].is_auto = 1;
        if (o->kind == OPT_INT) auto_defaults[i].v.i = *(const int *)o->dst;
        else if (o->kind == OPT_INT64) auto_defaults[i].v.l = *(const int64_t *)o->dst;
        else auto_defaults[i].v.s = *(const char *const *)o->dst;
    }
}

/* Store `v` into o->dst after strict validation. 1 when v is "auto" putting the default back (the
 * flag then counts as not given: cli_given, as if it were left out). */
static int opt_set(const Option *o, const char *v) {
    const AutoDefault *ad = auto_defaults ? &auto_defaults[o - auto_table] : NULL;
    if (ad && ad->is_auto && v && !strcmp(v, "auto")) {
        if (o->kind == OPT_INT) *(int *)o->dst = ad->v.i;
        else if (o->kind == OPT_INT64) *(int64_t *)o->dst = ad->v.l;
        else *(const char **)o->dst = ad->v.s;
        return 1;
    }
    char range[100];
    fmt_range(range, sizeof range, o->min, o->max);
    if (ad && ad->is_auto) strncat(range, " or auto", sizeof range - strlen(range) - 1);
    switch (o->kind) {
    case OPT_INT:
    case OPT_INT64: {
        char *end = NULL;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (v[0] == 0 || end == v || *end != 0 || (v[0] != '-' && v[0] != '+' && (v[0] < '0' || v[0] > '9')))
            die_user("--%s must be an integer in %s, got '%s'", o->name, range, v);
        if (errno == ERANGE || (double)x < o->min || (double)x > o->max)
            die_user("--%s must be an integer in %s, got '%s' (out of range)", o->name, range, v);
        if (o->kind == OPT_INT) *(int *)o->dst = (int)x; /* range fits an int (checked above) */
        else *(int64_t *)o->dst = (int64_t)x;
        break;
    }
    case OPT_FLOAT: {
        char *end = NULL;
        errno = 0;
        double x = strtod(v, &end);
        /* strtod also reads hex ("0x10" = 16) and "inf"/"nan": a decimal number only */
        if (v[0] == 0 || end == v || *end != 0 || isspace((unsigned char)v[0]) || strpbrk(v, "xX"))
            die_user("--%s must be a decimal number in %s, got '%s'", o->name, range, v);
        if (!isfinite(x) || (errno == ERANGE && fabs(x) > 1.0))
            die_user("--%s must be a finite number in %s, got '%s'", o->name, range, v);
        if (x < o->min || x > o->max)
            die_user("--%s must be a number in %s, got '%s' (out of range)", o->name, range, v);
        /* not 0, but 0 in fp32 (the weights', the GradScaler's): --lr 1e-50, a slip for 1e-5, trained
         * nothing; --clip-grad-norm 1e-50 clipped every gradient to 0; --backoff-factor 1e-50 zeroed the scale */
        if (x != 0 && (float)x == 0)
            die_user("--%s must be a number in %s, got '%s' (out of range: fp32 rounds it to 0)", o->name, range, v);
        *(double *)o->dst = x;
        break;
    }
    case OPT_STR: /* an empty value would read as "not given" (--resume "" trains from scratch) */
        if (v[0] == 0) die_user("--%s got an empty value: give it %s, or leave the flag out", o->name, opt_metavar(o));
        /* --report " " (a variable that held a space) wrote a file named " " */
        if (v[strspn(v, " \t\n")] == 0)
            die_user("--%s got only spaces: give it %s, or leave the flag out", o->name, opt_metavar(o));
        /* "-" is standard output or input to most tools: --report - wrote a file named "-" instead */
        if (!strcmp(v, "-") && strcmp(opt_metavar(o), "STR"))
            die_user("--%s '-': no flag here reads or writes standard input or output — give --%s a %s (write ./- "
                     "for one really named '-')", o->name, o->name, opt_metavar(o));
        /* The shell expands ~ only at the start of a word: --save=~/ck reaches us as a folder named "~"
         * in the current one, which a later `rm -rf ~` to clean it up would make a disaster. */
        if (v[0] == '~')
            die_user("--%s '%s' starts with '~', which the shell did not expand (it does only at the start of a "
                     "word: not after '=' or inside quotes) — write --%s %s with a space, or use $HOME; for a name "
                     "that really starts with '~', write ./%s", o->name, v, o->name, v, v);
        *(const char **)o->dst = v;
        break;
    case OPT_CHOICE:
        if (!choice_ok(o->choices, v)) die_user("--%s must be one of %s, got '%s'", o->name, o->choices, v);
        *(const char **)o->dst = v;
        break;
    case OPT_FLAG: *(int *)o->dst = 1; break;
    }
    return 0;
}

/* --help wins wherever it appears (except as another flag's value), and shows the defaults as they
 * are before any other flag is applied, so it is checked before parsing anything. */
static int wants_help(int argc, char **argv, const Option *opts) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 1;
        if (a[0] == '-' && a[1] == '-' && !strchr(a, '=')) {
            const Option *o = find_option(opts, a + 2, strlen(a + 2));
            if (o && o->kind != OPT_FLAG) i++; /* skip its value */
        }
    }
    return 0;
}

static const Option *parsed; /* the table of the last cli_parse: what cli_job_flags reads */
static const Option **given; /* the rows the last cli_parse met on its command line */
static int n_given;

/* Flags that may differ between the ranks of one job: where this process reads and writes (paths),
 * how it feeds itself, how it reaches the others, how it shows progress — and the choices that only
 * change how a result is computed, not which one. Everything else must agree on every rank. */
static const char *const local_flags[] = {
    "data", "workers", "cpu-threads", "pin-memory", "save", "keep-last", "resume", "report", "progress", "node-rank",
    "master-addr", "rdzv-timeout", "comm-timeout", "no-cuda-graph", "cudnn-benchmark", "deterministic",
    "memory-fraction",
    /* the job's shape: compared as it resolves, by the rendezvous (the world size, and no rank claimed
     * twice), so a node may write --nproc-per-node 8 where another's auto gives 8 */
    "nproc-per-node", "nnodes", NULL};
/* …and those whose path may differ, but not whether they are given: a traced rank waits for the
 * others before merging the rank files, so either every rank traces or none does. */
static const char *const presence_flags[] = {"trace", NULL};

static int listed(const char *const *list, const char *name) {
    for (; *list; list++)
        if (!strcmp(*list, name)) return 1;
    return 0;
}

static uint32_t flag_value_hash(const Option *o) {
    char buf[64];
    const char *text = buf;
    if (listed(presence_flags, o->name)) {
        const char *v = *(const char *const *)o->dst;
        text = v && *v ? "given" : "not given";
    } else switch (o->kind) {
    case OPT_INT: case OPT_FLAG: snprintf(buf, sizeof buf, "%d", *(const int *)o->dst); break;
    case OPT_INT64: snprintf(buf, sizeof buf, "%lld", (long long)*(const int64_t *)o->dst); break;
    case OPT_FLOAT: snprintf(buf, sizeof buf, "%.17g", *(const double *)o->dst); break;
    case OPT_STR: case OPT_CHOICE: text = *(const char *const *)o->dst ? *(const char *const *)o->dst : ""; break;
    }
    return (uint32_t)fnv1a64(FNV1A64_INIT, text, strlen(text));
}

const char *cli_local_flags_text(void) {
    static char text[512];
    size_t used = 0;
    for (const char *const *f = local_flags; *f; f++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s--%s", f == local_flags ? "" : ", ", *f);
    for (const char *const *f = presence_flags; *f && used < sizeof text; f++)
        used += (size_t)snprintf(text + used, sizeof text - used, "; --%s only in its value", *f);
    ASSERT(used < sizeof text);
    return text;
}

/* The sources this binary was built from (the Makefile's cksum of them): part of the first pair, so
 * ranks running builds of other sources are refused as other programs — two builds one commit apart
 * share every flag, and planned different buckets. The tests find the marker to make such a binary. */
#ifndef SOURCE_ID
#define SOURCE_ID 0
#endif
#define SOURCE_ID_TEXT_(x) #x
#define SOURCE_ID_TEXT(x) SOURCE_ID_TEXT_(x)
static const char source_id[] = "stage source id " SOURCE_ID_TEXT(SOURCE_ID);

int cli_job_flags(double *v, int cap, const char **names) {
    ASSERT(cap >= 2);
    int n = 2;
    uint64_t table = fnv1a64(FNV1A64_INIT, source_id, sizeof source_id);
    for (const Option *o = parsed; o && o->name; o++) { /* no table parsed (a unit test): no flags */
        table = fnv1a64(table, o->name, strlen(o->name) + 1);
        if (listed(local_flags, o->name)) continue;
        ASSERT(n < cap);
        names[n] = o->name;
        v[n++] = flag_value_hash(o);
    }
    /* a first pair that says which table and sources (another stage, or a build of other sources, has another) */
    names[0] = names[1] = NULL;
    v[0] = (double)(table & 0xffffffffu), v[1] = (double)n;
    for (int i = n; i < cap; i++) v[i] = 0, names[i] = NULL;
    return n;
}

void cli_lesson_flags(const char *lesson, const char *prints, const char *const *uses) {
    /* where a job would run and how it shows progress: a lesson on the host, printing one line, has
     * nothing to get wrong from them (scripts and the doc test pass --master-port to every run) */
    static const char *const anywhere[] = {"device", "master-port", "master-addr", "progress", NULL};
    /* every such flag at once: a training command turned into a lesson carries several, and naming
     * them one refusal at a time makes the user run it once per flag */
    char unread[1024] = "";
    size_t len = 0;
    int count = 0;
    for (int i = 0; i < n_given; i++) {
        if (listed(uses, given[i]->name) || listed(anywhere, given[i]->name)) continue;
        count++;
        if (len < sizeof unread)
            len += (size_t)snprintf(unread + len, sizeof unread - len, "%s--%s", len ? " " : "", given[i]->name);
    }
    if (count == 1)
        die_user("%s is not read by --%s, which prints %s and exits: drop %s (or drop --%s to train)", unread, lesson,
                 prints, unread, lesson);
    if (count > 1)
        die_user("%s are not read by --%s, which prints %s and exits: drop them (or drop --%s to train)", unread,
                 lesson, prints, lesson);
}

int cli_given(const char *name) {
    for (int i = 0; i < n_given; i++)
        if (!strcmp(given[i]->name, name)) return 1;
    return 0;
}

const char *cli_choice(const char *name) {
    const Option *o = parsed ? find_option(parsed, name, strlen(name)) : NULL;
    return o && (o->kind == OPT_CHOICE || o->kind == OPT_STR) ? *(const char *const *)o->dst : NULL;
}

/* The lines a closed stdout gets, built before any signal can come (snprintf is not signal-safe). */
static char broken_pipe_note[320], stopping_note[320];

/* Standard output's reader went away (`| head`, or `| tee` in an ssh session that dropped): the next
 * write raises SIGPIPE, whose default ends the process without a word — a run that vanished. Say why,
 * then die of the same signal, so the exit status (141) and a launcher's report stay what they were. */
static void on_broken_pipe(int sig) {
    if (stop_coming()) {
        /* `./stage1 --save … | tee log` and Ctrl-C: the terminal sends it to tee as well, which dies of
         * it. Dying here too would lose the step the stop promised to save: carry on without stdout
         * (its writes now fail with EPIPE), and the run's last lines come on stderr (report.c). */
        ssize_t w = write(STDERR_FILENO, stopping_note, strlen(stopping_note));
        (void)w;
        signal(sig, SIG_IGN);
        return;
    }
    ssize_t w = write(STDERR_FILENO, broken_pipe_note, strlen(broken_pipe_note));
    (void)w; /* stderr may be the same closed pipe: nothing more to do */
    signal(sig, SIG_DFL);
    raise(sig);
}

void cli_parse(int argc, char **argv, const Option *opts, const char *prog, const char *about) {
    /* Descriptors 0–2 closed by whoever started us (`>&- 2>&-`): the first files opened would take
     * them, and the console lines would go into the --save directory's lock, the --report file or a
     * checkpoint. /dev/null, read-only, holds each place: a write there still fails, as it did. */
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int null = open("/dev/null", O_RDONLY);
            if (null >= 0 && null != fd) dup2(null, fd), close(null);
        }
    /* Every stage starts here. A file-size limit (ulimit -f) would kill the process in the middle of
     * a write with SIGXFSZ, silently; ignored, the write fails with EFBIG, and the writer's own error
     * (checkpoint, report, trace) names the file and the fix. */
    signal(SIGXFSZ, SIG_IGN);
    snprintf(broken_pipe_note, sizeof broken_pipe_note,
             "%s: stopped — the program reading its output went away (SIGPIPE: `| head` ended, or a dropped "
             "ssh session under `| tee`); the checkpoints already saved are intact. To train on after the "
             "terminal goes, write the output to a file (> log 2>&1) under nohup, tmux or screen\n", prog);
    snprintf(stopping_note, sizeof stopping_note,
             "%s: the program reading its output went away with the signal (`| tee` gets the terminal's Ctrl-C "
             "too): the stop goes on, and its last lines come here\n", prog);
    signal(SIGPIPE, on_broken_pipe);
    parsed = opts;
    parsing_prog = prog;
    free(given);
    n_given = 0;
    given = xcalloc((size_t)argc + 1, sizeof *given);
    auto_defaults_read(opts);
    if (wants_help(argc, argv, opts)) {
        /* `--help | head` (or a pager quit early) is how help gets read: end quietly, as any tool does —
         * no training run stopped, so the broken-pipe note above would only alarm. */
        signal(SIGPIPE, SIG_DFL);
        cli_print_help(opts, prog, about);
        fflush(stdout);
        exit(0);
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        /* "—epochs": a slide, PDF or chat turned "--" into an em dash (or "–", an en dash) */
        if (!strncmp(a, "\xe2\x80\x94", 3) || !strncmp(a, "\xe2\x80\x93", 3))
            die_user("'%s' starts with a long dash (%.3s), not two hyphens — a slide, PDF or chat turns '--' into "
                     "one: type two hyphens, --%s", a, a, a + 3);
        if (a[0] != '-' || a[1] == 0)
            die_user("unexpected argument '%s' (every option is --name VALUE; see --help)", a);
        if (a[1] != '-' || a[2] == 0) die_unknown(opts, a); /* "-lr", "--" */
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const Option *o = find_option(opts, name, len);
        if (!o) die_unknown(opts, a);
        given[n_given++] = o;
        if (o->kind == OPT_FLAG) {
            if (eq) die_user("--%s is a flag and takes no value, got '%s' (write just --%s)", o->name, eq + 1, o->name);
            opt_set(o, NULL);
            continue;
        }
        const char *v;
        if (eq) v = eq + 1;
        else {
            if (i + 1 >= argc) die_user("--%s needs a value", o->name);
            v = argv[++i];
            /* "--lr --momentum 0.9", "--save -h": the value was forgotten — -h would otherwise become a
             * folder named "-h", a run where help was asked for. (A value that really starts with "--",
             * or is "-h", can be given as --data=--odd-name.) */
            if ((v[0] == '-' && v[1] == '-' && v[2] != 0) || !strcmp(v, "-h"))
                die_user("--%s needs a value, got option '%s' instead", o->name, v);
        }
        if (opt_set(o, v)) { /* "auto": as if never given, an earlier --name VALUE included */
            int k = 0;
            for (int j = 0; j < n_given; j++)
                if (given[j] != o) given[k++] = given[j];
            n_given = k;
        }
    }
}

const char *cli_cpu_fallback_what(void) {
    static char buf[200];
    const char *model = cli_choice("model"), *data = cli_choice("data");
    const int big_model = cli_given("model") && model && !strcmp(model, "resnet18"), own_data = data && data[0];
    if (!big_model && !own_data) return "small model, small dataset";
    snprintf(buf, sizeof buf, "%s, %s", big_model ? "ResNet-18 as --model asks: slow on a CPU" : "small model",
             !own_data                 ? "small dataset"
             : cli_given("train-size") ? "--train-size images of --data"
                                       : "every image of --data: minutes on a CPU, --train-size N takes fewer");
    return buf;
}

/* ----------------------------------------------------------------------------------------------
 * the shared configuration */

void config_defaults(TrainConfig *c) {
    memset(c, 0, sizeof *c);
    c->device = "auto";
    c->model = "";
    c->norm = "bn";
    c->layout = "auto";
    c->epochs = -1;
    c->steps = 0;
    c->batch_size = 128;
    c->lr = 0.1;
    c->momentum = 0.9;
    c->weight_decay = 5e-4;
    c->schedule = "cosine";
    c->warmup_start_factor = 0.01;
    c->seed = 0;
    c->log_every = 50;
    c->deterministic = 0;
    c->cudnn_benchmark = 0;
    c->no_tf32 = 0;
    c->no_cuda_graph = 0;
    c->data = "";
    c->train_size = -1;
    c->test_size = -1;
    c->workers = 2;
    c->cpu_threads = -1;
    c->pin_memory = 0;
    c->save = "";
    c->resume = "";
    c->evaluate = 0;
    c->report = "";
    c->progress = "auto";
    c->optimizer = "sgd";
    c->trace = "";
    c->trace_steps = TRACE_DEFAULT_STEPS;
}

static Option *volatile last_table;      /* config_options' result, kept reachable (see there) */

static Option *volatile kept_rows[16]; /* cli_rows' tables (a handful per program), kept reachable */
static int n_kept_rows;

Option *cli_rows(const Option *rows, size_t n, const Option *more) {
    size_t n_more = 0;
    while (more && more[n_more].name) n_more++;
    Option *t = xcalloc(n + n_more + 1, sizeof(Option)); /* calloc'd: the last row terminates */
    memcpy(t, rows, n * sizeof(Option));
    if (n_more) memcpy(t + n, more, n_more * sizeof(Option));
    if (n_kept_rows < 16) kept_rows[n_kept_rows++] = t;
    return t;
}
static const Option *volatile last_extra; /* and the stage's own rows (dp_options, ddp_options) */

Option *config_options(TrainConfig *c, const Option *extra) {
    const double above0 = nextafter(0.0, INFINITY), below1 = nextafter(1.0, 0.0);
    const Option common[] = {
        {"device", OPT_CHOICE, &c->device, 0, 0, "auto|cuda|cpu",
         "where to train; auto = CUDA if a GPU is visible, else the CPU (torch.device)"},
        {"model", OPT_CHOICE, &c->model, 0, 0, "resnet18|tiny",
         "resnet18 = CIFAR ResNet-18 (3x3 stem, no max-pool); tiny = a small CNN for CPU runs; "
         "auto: resnet18 on CUDA, tiny on CPU"},
        {"norm", OPT_CHOICE, &c->norm, 0, 0, "bn|none",
         "normalization after each conv: bn = nn.BatchNorm2d, none = nn.Identity"},
        {"epochs", OPT_INT, &c->epochs, 1, 100000, NULL,
         "passes over the training set; auto: 5 on CUDA, 4 on CPU"},
        {"steps", OPT_INT64, &c->steps, 0, 1e12, NULL,
         "stop after this many optimizer steps (0 = no limit: run all epochs)"},
        {"batch-size", OPT_INT, &c->batch_size, 1, 65536, NULL,
         "samples per device in each forward and backward (DataLoader batch_size; stage 2's one DataLoader "
         "batches --gpus times it, which DataParallel scatters); an optimizer step takes one such batch on each "
         "device, or --accum-steps of them where the stage accumulates"},
        {"lr", OPT_FLOAT, &c->lr, above0, 100, NULL, "peak learning rate (torch.optim.SGD / Adam lr)"},
        {"momentum", OPT_FLOAT, &c->momentum, 0, below1, NULL, "SGD momentum (torch.optim.SGD momentum)"},
        {"weight-decay", OPT_FLOAT, &c->weight_decay, 0, 1, NULL,
         "L2 penalty added to every gradient (torch.optim.SGD weight_decay)"},
        {"optimizer", OPT_CHOICE, &c->optimizer, 0, 0, "sgd|adam",
         "sgd = torch.optim.SGD(lr, momentum, weight_decay); adam = torch.optim.Adam(lr, "
         "weight_decay) with betas (0.9, 0.999), eps 1e-8 (--momentum unused; Adam's usual lr is 1e-3)"},
        {"schedule", OPT_CHOICE, &c->schedule, 0, 0, "const|cosine",
         "learning rate over the whole run: constant, or cosine decay "
         "(lr_scheduler.CosineAnnealingLR with T_max = total steps)"},
        {"warmup-steps", OPT_INT64, &c->warmup_steps, 0, 1e12, NULL,
         "raise the learning rate linearly over the first N optimizer steps, from --warmup-start-factor × lr to "
         "lr, then follow --schedule over the steps left (SequentialLR([LinearLR(start_factor, total_iters=N), "
         "main], milestones=[N]): torchvision's warm-up, stepped per optimizer step where it steps per epoch); "
         "0 = no warm-up"},
        {"warmup-start-factor", OPT_FLOAT, &c->warmup_start_factor, above0, 1, NULL,
         "with --warmup-steps: the first step's learning rate as a fraction of --lr (LinearLR start_factor; "
         "torchvision's lr_warmup_decay)"},
        {"clip-grad-norm", OPT_FLOAT, &c->clip_grad_norm, 0, 1e30, NULL,
         "before each optimizer step, scale the gradients down so that their total 2-norm is at most this "
         "(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)); the norm before clipping is "
         "reported every --log-every steps. 0 = no clipping"},
        {"seed", OPT_INT64, &c->seed, 0, 4294967295.0, NULL,
         "seeds weights, data order and augmentation (torch.manual_seed; 32 bits, as mt19937 uses)"},
        {"log-every", OPT_INT, &c->log_every, 1, 1e9, NULL, "record a step line every N optimizer steps"},
        {"deterministic", OPT_FLAG, &c->deterministic, 0, 0, NULL,
         "bitwise-reproducible runs: deterministic kernels only "
         "(torch.use_deterministic_algorithms(True), torch.backends.cudnn.deterministic = True)"},
        {"cudnn-benchmark", OPT_FLAG, &c->cudnn_benchmark, 0, 0, NULL,
         "time cuDNN's conv algorithms once and use the fastest (torch.backends.cudnn.benchmark = True)"},
        {"no-tf32", OPT_FLAG, &c->no_tf32, 0, 0, NULL,
         "full-FP32 convolutions instead of TF32 (torch.backends.cudnn.allow_tf32 = False); fp32 matmuls "
         "never use TF32 here (PyTorch's default, torch.backends.cuda.matmul.allow_tf32 = False)"},
        {"no-cuda-graph", OPT_FLAG, &c->no_cuda_graph, 0, 0, NULL,
         "launch the training step's kernels one by one instead of replaying them as CUDA graphs "
         "(PyTorch eager does; torch.cuda.graphs does not). Stage 2 never uses graphs"},
        {"memory-fraction", OPT_FLOAT, &device_memory_fraction, above0, 1, NULL,
         "cap what this process allocates on each device (the peak memory account; not the CUDA context or "
         "NCCL's buffers) at this fraction of the device's memory (the host's RAM on the CPU backend); past it "
         "an allocation fails as out of memory (torch.cuda.set_per_process_memory_fraction). 1: no cap"},
        {"layout", OPT_CHOICE, &c->layout, 0, 0, "auto|nhwc|nchw",
         "activations on the GPU: nhwc (channels-last, torch.channels_last: cuDNN's tensor-core "
         "kernels read it as is) or nchw (PyTorch's default: cuDNN transforms the layout around every "
         "convolution); auto = nhwc, except stage 2 (nchw). The CPU backend always keeps NCHW"},
        {"data", OPT_STR, &c->data, 0, 0, NULL,
         "CIFAR-10 binary version DIR (data_batch_1..5.bin, test_batch.bin); none = synthetic data"},
        {"train-size", OPT_INT64, &c->train_size, 1, 1e9, NULL,
         "training samples to use; auto: all of CIFAR-10, or synthetic 50000 on CUDA / 8192 on CPU"},
        {"test-size", OPT_INT64, &c->test_size, 1, 1e9, NULL,
         "test samples to evaluate; auto: all of CIFAR-10, or synthetic 10000 on CUDA / 1024 on CPU"},
        {"workers", OPT_INT, &c->workers, 0, 64, NULL,
         "data-loading threads (DataLoader num_workers; 0 = load in the training thread)"},
        {"cpu-threads", OPT_INT, &c->cpu_threads, 1, CPU_THREADS_MAX, NULL,
         "CPU backend: threads per process for convolutions, batch norm, ReLU (torch.set_num_threads); same bits for "
         "any count; auto: OMP_NUM_THREADS, else the cores shared among this host's workers"},
        {"pin-memory", OPT_FLAG, &c->pin_memory, 0, 0, NULL,
         "page-locked host batches for asynchronous copies (DataLoader pin_memory=True)"},
        {"save", OPT_STR, &c->save, 0, 0, NULL,
         "write checkpoints into DIR (created if missing) at the end of every epoch; a DIR holding another "
         "run's is refused, unless --resume continues one of them"},
        {"keep-last", OPT_INT, &c->keep_last, 0, 1000000, NULL,
         "with --save: remove this run's older checkpoints, keeping the newest N (0 = keep all); resumed into "
         "its directory, the checkpoints up to where it resumed count as this run's"},
        {"resume", OPT_STR, &c->resume, 0, 0, NULL,
         "continue training from checkpoint FILE: weights, optimizer state (SGD momentum, or Adam's moments and "
         "step), stage 5's GradScaler state and data position"},
        {"evaluate", OPT_FLAG, &c->evaluate, 0, 0, NULL,
         "with --resume FILE: test that checkpoint's model on the test set and exit, training nothing "
         "(PyTorch examples' --evaluate)"},
        {"report", OPT_STR, &c->report, 0, 0, NULL,
         "write JSON lines (config, step, epoch, summary records, and each stage's own) to FILE, for scripts"},
        {"progress", OPT_CHOICE, &c->progress, 0, 0, "auto|on|off",
         "progress bar with ETA; auto = only when stdout is a terminal"},
        {"trace", OPT_STR, &c->trace, 0, 0, NULL,
         "write a timeline (Chrome trace-event JSON: Perfetto, chrome://tracing, make timeline) to FILE"},
        {"trace-steps", OPT_STR, &c->trace_steps, 0, 0, NULL,
         "A:B — trace optimizer steps A (from 0) to B (excluded) only, so the file stays small"},
    };
    int n_common = (int)(sizeof common / sizeof common[0]), n_extra = 0;
    while (extra && extra[n_extra].name) n_extra++;
    Option *t = xcalloc((size_t)(n_common + n_extra + 1), sizeof(Option));
    memcpy(t, common, sizeof common);
    if (n_extra) memcpy(t + n_common, extra, (size_t)n_extra * sizeof(Option));
    /* The stages parse once and keep the tables to the end (cli_parse(…, config_options(…))): they
     * are held here so that they stay reachable, and leak checkers do not report them as lost. */
    last_table = t, last_extra = extra;
    return t; /* calloc'd, so row n_common + n_extra has name == NULL */
}

/* The directory part of a path ("a/b/c" → "a/b", "c" → ".", "/c" → "/"), malloc'd. */
static char *path_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return xstrdup(".");
    size_t len = (size_t)(slash - path);
    while (len > 0 && path[len - 1] == '/') len--;
    if (len == 0) return xstrdup("/");
    char *d = xmalloc(len + 1);
    memcpy(d, path, len);
    d[len] = 0;
    return d;
}

/* Where a path leads: its directory's real path, then its name — what two spellings of one file that
 * does not exist yet ("r.json", "./a/../r.json") share; a symlink to a file not yet there (a dangling
 * link) leads to its target. malloc'd; NULL if the directory cannot be resolved. */
static char *path_normal(const char *path) {
    char *p = xstrdup(path), link[PATH_MAX];
    struct stat st;
    for (int hops = 0; hops < 40 && lstat(p, &st) == 0 && S_ISLNK(st.st_mode); hops++) {
        ssize_t n = readlink(p, link, sizeof link - 1);
        if (n <= 0) break;
        link[n] = 0;
        char *dir = path_dir(p), *next = NULL;
        if (asprintf(&next, "%s%s%s", link[0] == '/' ? "" : dir, link[0] == '/' ? "" : "/", link) < 0) next = NULL;
        free(dir), free(p);
        if (!next) return NULL;
        p = next;
    }
    char *dir = path_dir(p), *real = realpath(dir, NULL), *out = NULL;
    const char *slash = strrchr(p, '/'), *name = slash ? slash + 1 : p;
    if (real && asprintf(&out, "%s%s%s", real, strcmp(real, "/") ? "/" : "", name) < 0) out = NULL;
    free(dir), free(real), free(p);
    return out;
}

/* Two path flags name one file: the same inode when either exists (a device such as /dev/null takes
 * any number of writers), else the same normalised path — both would create it. */
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea || eb) return ea && eb && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && !S_ISCHR(sa.st_mode);
    char *na = path_normal(a), *nb = path_normal(b);
    int same = na && nb && !strcmp(na, nb);
    free(na), free(nb);
    return same;
}

/* path is FILE.tmp or FILE.rankN.json[.tmp] of --trace FILE (where each leads, through symlinks):
 * the files a trace writes before it is renamed into place or merged. */
static int trace_writes(const char *trace, const char *path) {
    char *nt = path_normal(trace), *np = path_normal(path), *tmp = NULL;
    int yes = 0;
    if (asprintf(&tmp, "%s.tmp", trace) >= 0 && same_file(path, tmp)) yes = 1;
    size_t n = nt ? strlen(nt) : 0;
    if (!yes && nt && np && !strncmp(np, nt, n) && !strncmp(np + n, ".rank", 5)) {
        const char *p = np + n + 5, *digits = p;
        while (*p >= '0' && *p <= '9') p++;
        yes = p > digits && (!strcmp(p, ".json") || !strcmp(p, ".json.tmp"));
    }
    free(nt), free(np), free(tmp);
    return yes;
}

/* A --report file is emptied when the run starts, a --trace file replaced when it ends: refuse now what
 * would fail or hang then — a directory, a FIFO (opening it waits for a reader forever), a socket — and
 * a checkpoint, which a typo would destroy. `what` names the file in messages ("--report", "--trace t.json: the rank file");
 * `example`, a file name to suggest under a directory given by mistake (NULL: a name the run derived). */
static void check_output(const char *flag, const char *what, const char *path, const char *example) {
    struct stat st;
    if (stat(path, &st) != 0) return; /* created when the run starts */
    if (S_ISDIR(st.st_mode) && example) {
        int n = (int)strlen(path);
        while (n > 0 && path[n - 1] == '/') n--; /* "adir/" suggests adir/report.jsonl, not adir//… */
        die_user("%s '%s' is a directory (give a file name, e.g. %.*s/%s)", what, path, n, path, example);
    }
    if (S_ISDIR(st.st_mode))
        die_user("%s '%s' is a directory: remove it, or give %s another file name", what, path, flag);
    if (S_ISFIFO(st.st_mode)) die_user("%s '%s' is a FIFO: give it a regular file", what, path);
    if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode))
        die_user("%s '%s' is not a regular file (a socket or block device): give it a file path", what, path);
    if (S_ISREG(st.st_mode) && checkpoint_is_one(path))
        die_user("%s '%s' is a checkpoint (written by --save): writing there would destroy it — give %s another "
                 "file name", what, path, flag);
    /* A kernel's pseudo-file (/proc, /sys, cgroups, debugfs, tracefs, …) looks like a regular file but
     * takes no report: the write fails after the training, with advice about free space that does
     * not apply — or, as root, writes a kernel setting. */
    static const struct { unsigned long magic; const char *name; } pseudo[] = {
        {PROC_SUPER_MAGIC, "/proc"}, {SYSFS_MAGIC, "/sys"}, {CGROUP_SUPER_MAGIC, "cgroup"},
        {CGROUP2_SUPER_MAGIC, "cgroup2"}, {DEBUGFS_MAGIC, "debugfs"}, {TRACEFS_MAGIC, "tracefs"},
        {SECURITYFS_MAGIC, "securityfs"}, {BPF_FS_MAGIC, "bpffs"}, {PSTOREFS_MAGIC, "pstore"},
        {EFIVARFS_MAGIC, "efivarfs"}};
    struct statfs fs;
    const int regular_fs = S_ISREG(st.st_mode) && statfs(path, &fs) == 0;
    for (size_t i = 0; regular_fs && i < sizeof pseudo / sizeof pseudo[0]; i++)
        if ((unsigned long)fs.f_type == pseudo[i].magic)
            die_user("%s '%s' is a kernel pseudo-file (%s), not a file a run can write: give %s a file of its own",
                     what, path, pseudo[i].name, flag);
    /* /dev/stdout (or /dev/stderr) into a file: the report would write over the console's lines, the
     * trace replace the file under them. A terminal or /dev/null takes any number of writers. */
    struct stat fd_st;
    for (int fd = 1; fd <= 2; fd++)
        if (S_ISREG(st.st_mode) && fstat(fd, &fd_st) == 0 && fd_st.st_dev == st.st_dev && fd_st.st_ino == st.st_ino)
            die_user("%s '%s' is where this run's %s goes: writing it there would destroy the console's lines — "
                     "give %s a file of its own", what, path, fd == 1 ? "output" : "error output", flag);
}

/* Two spellings of one directory that may not exist yet (so no stat): "runs/a", "./runs/a/". */
static int same_dir_text(const char *a, const char *b) {
    while (a[0] == '.' && a[1] == '/') a += 2;
    while (b[0] == '.' && b[1] == '/') b += 2;
    size_t la = strlen(a), lb = strlen(b);
    while (la > 1 && a[la - 1] == '/') la--;
    while (lb > 1 && b[lb - 1] == '/') lb--;
    return la == lb && !strncmp(a, b, la);
}

/* The directory an output file goes into: missing (with the command that makes it), or a file where
 * it should be — for which mkdir -p is no fix. --save's directory is the exception: the run creates
 * it anyway, so `--save runs/a --report runs/a/report.jsonl` works as one would expect. */
static void check_output_dir(const TrainConfig *c, const char *flag, const char *path) {
    char *dir = path_dir(path);
    struct stat st;
    if (c->save && c->save[0] && stat(dir, &st) != 0 && errno == ENOENT && same_dir_text(dir, c->save))
        make_dirs("--save", c->save);
    const int found = stat(dir, &st) == 0, e = errno;
    if (!found && e == ENOENT)
        die_user("%s '%s': directory '%s' does not exist (create it first: mkdir -p %s)", flag, path, dir, dir);
    if ((found && !S_ISDIR(st.st_mode)) || (!found && e == ENOTDIR))
        die_user("%s '%s': '%s' is a file, not a directory (or a path through one) — give %s a path in a directory",
                 flag, path, dir, flag);
    errno = e;
    if (!found) die_user("%s '%s': directory '%s': %s — give %s a path in a directory you can reach", flag, path, dir,
                         errno_string(), flag);
    free(dir);
}

/* The directory a file will be created in takes one: a directory without write permission, a read-only
 * mount, or a pseudo-filesystem that stat calls a directory (/sys, /proc) refused the trace's .tmp only
 * after the run header, and stages 3–5's report and trace after the launch. access(W_OK) is no test of it
 * (root passes, and it knows nothing of /sys): a file is made there and removed at once, under a name
 * of this process's own (mkstemp), so that ranks checking one directory at the same time never meet. */
void cli_check_dir_takes_files(const char *flag, const char *path, const char *example, int in_place) {
    struct stat st;
    if (!path || !path[0]) return;
    const int exists = stat(path, &st) == 0, is_dir = exists && S_ISDIR(st.st_mode);
    if (exists && (S_ISCHR(st.st_mode) || in_place)) return; /* written where it is (a device: /dev/null) */
    char *dir = is_dir ? xstrdup(path) : path_dir(path), *probe = NULL; /* a directory (--save): files go in it */
    const char *slash = strrchr(path, '/'), *base = is_dir ? example : slash ? slash + 1 : path;
    if (asprintf(&probe, "%s/.%.40s.probe.XXXXXX", dir, base) < 0)
        die_at(__FILE__, __LINE__, "asprintf", "out of memory", NULL);
    int fd = mkostemp(probe, O_CLOEXEC);
    if (fd < 0)
        die_user("%s '%s': cannot create a file in directory '%s' (%s) — give %s a path in a directory you can "
                 "write (e.g. ./%s)", flag, path, dir, errno_string(), flag, base[0] ? base : example);
    close(fd);
    unlink(probe);
    free(probe), free(dir);
}

/* Stages 3–5 write --trace FILE per rank into FILE.rankN.json first (through FILE.rankN.json.tmp):
 * any of those names already there must take a file too (how many ranks there will be is not known
 * here, so every N is checked). */
static void check_rank_files(const char *trace) {
    char *dir = path_dir(trace), what[200];
    const char *slash = strrchr(trace, '/'), *base = slash ? slash + 1 : trace;
    size_t n = strlen(base);
    DIR *d = n ? opendir(dir) : NULL;
    struct dirent *e;
    snprintf(what, sizeof what, "--trace %.120s: the rank file", trace);
    while (d && (e = readdir(d))) {
        const char *p = e->d_name, *digits;
        if (strncmp(p, base, n) || strncmp(p + n, ".rank", 5)) continue;
        for (p = digits = p + n + 5; *p >= '0' && *p <= '9'; p++) {}
        if (p == digits || (strcmp(p, ".json") && strcmp(p, ".json.tmp"))) continue;
        char *path = NULL;
        if (asprintf(&path, "%s/%s", dir, e->d_name) < 0) die_at(__FILE__, __LINE__, "asprintf", "out of memory", NULL);
        check_output("--trace", what, path, NULL);
        free(path);
    }
    if (d) closedir(d);
    free(dir);
}

/* The file path leads to (through any symlink) lies in dir itself (the same inode). */
static int in_dir(const char *path, const char *dir) {
    char *real = realpath(path, NULL), *pd = path_dir(real ? real : path);
    struct stat a, b;
    int yes = stat(pd, &a) == 0 && stat(dir, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    free(real), free(pd);
    return yes;
}

/* An output must not take the name of an input or of a checkpoint this run will write: the report is
 * emptied when the run starts and the trace replaced when it ends, so one named like a CIFAR file
 * destroys the dataset; in --save, a save renames its checkpoint over a file of that name — or, named
 * like the save's .tmp, writes into the report the run still holds open. check_output catches files
 * that are checkpoints already; these are not yet. */
static void check_not_clobbering(const TrainConfig *c, const char *flag, const char *path) {
    char *norm = path_normal(path); /* where it leads: a symlink named r.json may point at ck/epoch002.ckpt */
    const char *where = norm ? norm : path, *slash = strrchr(where, '/'), *name = slash ? slash + 1 : where;
    if (c->save && c->save[0] && (checkpoint_name_is_one(name) || !strcmp(name, ".lock")) && in_dir(where, c->save)) {
        int len = (int)strlen(c->save);
        while (len > 1 && c->save[len - 1] == '/') len--;
        const char *lit = strrchr(path, '/');
        const int linked = strcmp(lit ? lit + 1 : path, name) != 0;
        die_user("%s '%s'%s%s%s has the name of a %s that --save '%s' writes: the save would replace it or write "
                 "into it — give %s another file name (e.g. %.*s/%s)", flag, path, linked ? " (a link to '" : "",
                 linked ? where : "", linked ? "')" : "",
                 strcmp(name, ".lock") ? "checkpoint" : "lock file (the directory's owner, for other runs)", c->save,
                 flag, len, c->save, !strcmp(flag, "--trace") ? "trace.json" : "report.jsonl");
    }
    for (int i = 0; c->data && c->data[0] && i < CIFAR10_FILES; i++) {
        char *input = NULL;
        ASSERT(asprintf(&input, "%s/%s", c->data, cifar10_file_names[i]) >= 0);
        if (same_file(path, input))
            die_user("%s '%s' is %s, which --data reads: writing it would destroy the dataset — give %s another "
                     "file name", flag, path, input, flag);
        free(input);
    }
    /* Without --data too: a run on synthetic data, pointed by a slip of the shell's completion at the
     * real set's folder, would leave the next --data run a "truncated download". */
    for (int i = 0; i < CIFAR10_FILES; i++)
        if (!strcmp(name, cifar10_file_names[i]))
            die_user("%s '%s' has the name of a CIFAR-10 file: writing it would destroy the dataset if it is "
                     "one — give %s another file name", flag, path, flag);
    free(norm); /* name points into it */
}

/* --evaluate's view of every flag of every stage. Kept: what the model is and how its forward runs,
 * the test data, where the job runs and how its ranks meet, what is reported. Training only: the
 * schedule and the optimizer, the training data and its sampler, checkpoints written, the trace,
 * DataParallel's replicas and modelled Python (stage 2 evaluates on GPU0's replica, as after every
 * epoch), DDP's gradient buckets, accumulation, the GradScaler — none of them touches a forward in
 * eval mode, so a run that evaluates would silently ignore them. */
static const char *const evaluate_keeps[] = {
    "device", "model", "norm", "batch-size", "seed", "deterministic", "cudnn-benchmark", "no-tf32", "no-cuda-graph",
    "memory-fraction", "layout", "data", "test-size", "workers", "cpu-threads", "pin-memory", "resume", "evaluate",
    "report", "progress", "help", "nproc-per-node", "nnodes", "node-rank", "master-addr", "master-port",
    "standalone", "comm", "rdzv-timeout", "comm-timeout", "unused-param", "amp", "channels-last", NULL};
static const char *const evaluate_refuses[] = {
    "epochs", "steps", "lr", "momentum", "weight-decay", "optimizer", "schedule", "warmup-steps",
    "warmup-start-factor", "clip-grad-norm", "log-every", "train-size", "save",
    "keep-last", "trace", "trace-steps", "gpus", "gil-switch-ms", "gil-op-us", "gil-host-call-us",
    "gil-host-module-us", "gil-host-param-us", "gil-host-thread-us", "gil-host-us", "dp-plan-us", "dp-plan-bench-us",
    "no-python", "dp-thread-pool", "p2p", "bucket-mb", "last-bucket-mb", "broadcast-buffers", "no-overlap",
    "optimizer-overlap", "find-unused-parameters", "sync-bn", "drop-last", "no-shuffle", "accum-steps",
    "sync-each-micro-step", "init-scale", "growth-factor", "backoff-factor", "growth-interval", "no-grad-scaler",
    "grad-stats", "grad-comm",
    "test-inf-step", "show-sampler", "dataset-size", "world-size", "rank", "epoch", "show-scaler", NULL};

int cli_evaluate_keeps(const char *name) {
    return listed(evaluate_keeps, name) ? 1 : listed(evaluate_refuses, name) ? 0 : -1;
}

/* --evaluate: a checkpoint to test, and no flag that only training would have read. */
static void evaluate_check(const TrainConfig *c) {
    if (!c->evaluate) return;
    if (!c->resume || !c->resume[0])
        die_user("--evaluate tests a checkpoint's model: give it one with --resume FILE (a file written by --save, "
                 "e.g. DIR/epoch003.ckpt)");
    for (int i = 0; i < n_given; i++)
        if (cli_evaluate_keeps(given[i]->name) == 0)
            die_user("--%s applies only to training, and --evaluate trains nothing: drop --%s (or drop --evaluate to "
                     "train)", given[i]->name, given[i]->name);
}

/* This stage's options (config_options' table) include --flag: stages 3–5 have --nproc-per-node (a
 * launcher and workers), stages 4–5 --accum-steps. */
static int stage_has(const char *flag) { return last_table && find_option(last_table, flag, strlen(flag)); }

void config_resolve(TrainConfig *c, int cuda, int saver) {
    const int synthetic = !c->data || !c->data[0];
    if (!strcmp(c->device, "auto")) c->device = cuda ? "cuda" : "cpu";
    if (c->evaluate && c->resume && c->resume[0]) { /* the checkpoint's model, unless the flags name one */
        static char arch[32], norm[8];
        if (checkpoint_peek_model(c->resume, arch, norm)) {
            if (!cli_given("model") && (!strcmp(arch, "resnet18") || !strcmp(arch, "tiny"))) c->model = arch;
            if (!cli_given("norm") && (!strcmp(norm, "bn") || !strcmp(norm, "none"))) c->norm = norm;
        }
    }
    if (!c->model[0]) c->model = cuda ? "resnet18" : "tiny";
    if (c->epochs < 0) c->epochs = cuda ? 5 : 4;
    if (strcmp(c->layout, "auto")) model_default_layout(!strcmp(c->layout, "nhwc"));
    if (cli_given("channels-last")) model_check_layout(); /* stage 5: here, before any worker starts */
    if (c->no_cuda_graph) model_default_graphs(0);
    /* CIFAR-10 keeps −1 ("all of it"): only the loader knows how many samples the files hold. */
    if (c->train_size < 0 && synthetic) c->train_size = cuda ? 50000 : 8192;
    if (c->test_size < 0 && synthetic) c->test_size = cuda ? 10000 : 1024;

    /* Cross-flag rules and paths: fail now, not after an epoch of training. */
    /* --deterministic with --cudnn-benchmark is allowed, as in PyTorch: the search then only
     * considers deterministic algorithms. */
    struct stat st;
    if (!synthetic) { /* every file there, of a sane size, and enough samples: before any worker starts */
        if (!c->evaluate) c->data_train_records = cifar10_check(c->data, 1, c->train_size > 0 ? c->train_size : 0);
        c->data_test_records = cifar10_check(c->data, 0, c->test_size > 0 ? c->test_size : 0);
    }
    if (c->resume && c->resume[0]) {
        if (stat(c->resume, &st) != 0)
            die_user("--resume '%s': %s (give a file written by --save, e.g. DIR/epoch003.ckpt)",
                     c->resume, errno_string());
        if (S_ISDIR(st.st_mode)) { /* a --save directory: name its newest checkpoint, the one Ctrl-C's line names */
            char *newest = NULL;
            if (checkpoint_list(c->resume, &newest) > 0)
                die_user("--resume '%s' is a directory: give a checkpoint file in it (the newest: --resume %s)",
                         c->resume, newest);
            die_user("--resume '%s' is a directory, and holds no checkpoint: give a checkpoint file written by --save "
                     "(e.g. DIR/epoch003.ckpt)", c->resume);
        }
        if (!S_ISREG(st.st_mode))
            die_user("--resume '%s' is not a regular file (a device, FIFO or socket): give a checkpoint file "
                     "written by --save", c->resume);
        if (access(c->resume, R_OK) != 0) die_user("--resume '%s' is not readable: %s", c->resume, errno_string());
        checkpoint_check_start(c->resume); /* no checkpoint at all (wrong magic, empty): now, not after the model */
    }
    /* The sampler lesson's flags (stages 3–5): --show-sampler returns before this, so a training run that
     * has them would ignore them — --world-size 4 does not make four workers, --epoch 3 is not --epochs. */
    static const char *const lesson_only[][2] = {
        {"world-size", "the job's size comes from --nproc-per-node (× --nnodes) or the launcher"},
        {"rank", "each worker's rank comes from the launcher"},
        {"dataset-size", "the dataset's length comes from --train-size or --data"},
        {"epoch", "to train for N epochs use --epochs N"}};
    for (size_t i = 0; i < sizeof lesson_only / sizeof lesson_only[0]; i++)
        if (cli_given(lesson_only[i][0]))
            die_user("--%s only applies to --show-sampler (the sampler lesson): %s — drop --%s, or add "
                     "--show-sampler", lesson_only[i][0], lesson_only[i][1], lesson_only[i][0]);
    evaluate_check(c);
    if (!strcmp(c->optimizer, "adam") && cli_given("momentum"))
        die_user("--momentum is SGD's: --optimizer adam uses its betas (0.9, 0.999) instead — drop --momentum, "
                 "or train with --optimizer sgd");
    if (c->keep_last > 0 && !(c->save && c->save[0]))
        die_user("--keep-last %d keeps the newest checkpoints that --save writes: give --save DIR too, or drop it",
                 c->keep_last);
    /* DDP's optimizer overlap steps each bucket as its all-reduce lands: it needs the buckets and the
     * one all-reduce per optimizer step that no_sync gives (stages 3–5's flags). */
    const char *optimizer_overlap = cli_choice("optimizer-overlap");
    const int stepping_per_bucket = optimizer_overlap && strcmp(optimizer_overlap, "off");
    if (stepping_per_bucket && cli_given("no-overlap"))
        die_user("--optimizer-overlap steps each bucket as its all-reduce is done, and --no-overlap has no "
                 "buckets: drop one of the two");
    if (cli_given("warmup-start-factor") && c->warmup_steps == 0)
        die_user("--warmup-start-factor %g sets where --warmup-steps N starts: give --warmup-steps N too, or drop it",
                 c->warmup_start_factor);
    if (c->warmup_steps == 0) c->warmup_start_factor = 0; /* no warm-up has no start: as a checkpoint records it */
    if (stepping_per_bucket && c->clip_grad_norm > 0)
        die_user("--clip-grad-norm scales every gradient by the norm of the whole averaged gradient, and "
                 "--optimizer-overlap steps each bucket as soon as its own all-reduce is done, before that norm "
                 "exists (PyTorch's _register_fused_optim cannot clip either): drop one of the two");
    if (stepping_per_bucket && cli_given("sync-each-micro-step"))
        die_user("--optimizer-overlap with --sync-each-micro-step would step the optimizer after every "
                 "micro-batch (every backward all-reduces): drop one of the two");
    if (cli_given("trace-steps") && !(c->trace && c->trace[0]))
        die_user("--trace-steps %s chooses the steps that --trace FILE records: give --trace FILE too, or drop it",
                 c->trace_steps);
    if (c->save && c->save[0] && stat(c->save, &st) == 0 && !S_ISDIR(st.st_mode))
        die_user("--save '%s' exists and is not a directory (--save takes a directory for the checkpoints)", c->save);
    /* Two of --report, --trace and --resume naming one file: the report or the trace would empty the
     * checkpoint before it is read, or both would write into one file, each corrupting the other. */
    const char *const named[3][2] = {{"--report", c->report}, {"--trace", c->trace}, {"--resume", c->resume}};
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (named[i][1] && named[i][1][0] && named[j][1] && named[j][1][0] && same_file(named[i][1], named[j][1]))
                die_user("%s '%s' and %s '%s' are the same file: %s — give %s another file name", named[i][0],
                         named[i][1], named[j][0], named[j][1],
                         j == 2 ? "writing it would destroy the checkpoint before it is read"
                                : "both would write into it, each corrupting the other", named[i][0]);
    /* …or one of the files --trace FILE writes besides FILE: FILE.tmp (renamed over FILE at the end)
     * and, in stages 3–5, each rank's FILE.rankN.json and its .tmp — a report there would be replaced
     * by a trace, a checkpoint there destroyed. */
    for (int i = 0; c->trace && c->trace[0] && i < 3; i += 2)
        if (named[i][1] && named[i][1][0] && trace_writes(c->trace, named[i][1]))
            die_user("%s '%s' is one of the files --trace '%s' writes (its .tmp, or a rank's .rankN.json): %s — "
                     "give %s another file name", named[i][0], named[i][1], c->trace,
                     i == 2 ? "the trace would be renamed over the checkpoint" : "the trace would replace the report",
                     i == 2 ? "--trace" : "--report");
    if (c->report && c->report[0]) {
        check_output_dir(c, "--report", c->report);
        check_output("--report", "--report", c->report, "report.jsonl");
        check_not_clobbering(c, "--report", c->report);
        /* rank 0 writes it: stages 3–5's launcher of node 0 checks (launch.c) — another node's rank may
         * have no such directory to write in, and needs none */
        if (!stage_has("nproc-per-node"))
            cli_check_dir_takes_files("--report", c->report, "report.jsonl", 1);
    }
    int64_t ta, tb;
    trace_parse_steps(c->trace_steps, &ta, &tb); /* checked even without --trace: a typo is refused */
    if (c->trace && c->trace[0]) {
        check_output_dir(c, "--trace", c->trace);
        check_output("--trace", "--trace", c->trace, "trace.json"); /* the file, or where stages 3–5 merge */
        char *tmp = NULL, what[200];
        if (asprintf(&tmp, "%s.tmp", c->trace) < 0) die_at(__FILE__, __LINE__, "asprintf", "out of memory", NULL);
        snprintf(what, sizeof what, "--trace %.120s: its .tmp file", c->trace);
        check_output("--trace", what, tmp, NULL); /* written first, then renamed over FILE */
        free(tmp);
        check_rank_files(c->trace);
        check_not_clobbering(c, "--trace", c->trace);
        cli_check_dir_takes_files("--trace", c->trace, "trace.json", 0); /* every rank writes one there */
        /* One process (stages 1 and 2, which have no --nproc-per-node): the file another run is writing,
         * or another user's, refused now as trace_configure would after the run header. Stages 3–5's
         * launcher does this for every rank (launch.c); a worker must not, its rank 0 may hold the lock. */
        if (!stage_has("nproc-per-node"))
            trace_check_free(c->trace, 0, 1, 1);
    }
    /* What an out-of-memory error will advise (device.c): the levers this run has. Accumulation keeps
     * the optimizer's batch while a micro-batch shrinks (stages 4 and 5). */
    const int accum = stage_has("accum-steps");
    char more[160] = "";
    if (accum && c->accum_steps > 1)
        snprintf(more, sizeof more, "; raise --accum-steps (now %d) as --batch-size falls to keep the optimizer's "
                 "batch", c->accum_steps);
    else if (accum)
        snprintf(more, sizeof more, "; --batch-size %d/K with --accum-steps K keeps the optimizer's batch",
                 c->batch_size);
    device_oom_smaller_model = strcmp(c->model, "tiny") != 0;
    snprintf(device_oom_fix, sizeof device_oom_fix, "lower --batch-size (now %d)%s%s", c->batch_size,
             device_oom_smaller_model ? ", or use --model tiny" : "", more);
    /* A fresh run into a --save directory that holds another run's checkpoints would overwrite them (every
     * run writes the same epochNNN.ckpt names); continuing one of them there is the resume flow. Decided
     * here, before stages 3–5 start their workers, so every rank agrees. The saver locks the directory
     * first, so that no other run writes there from this check on. The checkpoints of a run refused here
     * may be those of one still saving: its lock says so (asked only then — a rank of this job may find
     * its own rank 0's lock, which is no other run's). */
    if (c->save && c->save[0]) {
        if (saver) checkpoint_lock(c->save);
        char *partial = NULL;
        int np = saver ? checkpoint_list_partial(c->save, &partial) : 0;
        if (np > 0) /* ours to say now that we hold the lock: no run is writing them */
            printf("note: --save '%s' holds %d partial checkpoint%s (%s%s), left by a save that was interrupted; "
                   "no run reads %s — delete %s\n", c->save, np, np == 1 ? "" : "s", partial, np > 1 ? ", …" : "",
                   np == 1 ? "it" : "them", np == 1 ? "it" : "them");
        free(partial);
        char *newest = NULL;
        int n = checkpoint_list(c->save, &newest), resumed = c->resume && c->resume[0];
        if (n > 0 && (!resumed || !in_dir(c->resume, c->save))) checkpoint_lock_check(c->save);
        if (n > 0 && !resumed)
            die_user("--save '%s' already holds %d checkpoint%s of an earlier run (newest: %s), which this run would "
                     "overwrite — continue that run with --resume %s, give --save another directory, or delete them",
                     c->save, n, n == 1 ? "" : "s", newest, newest);
        if (n > 0 && !in_dir(c->resume, c->save))
            die_user("--save '%s' already holds %d checkpoint%s of another run (newest: %s), and --resume '%s' is not "
                     "one of them: this run would overwrite them — give --save another directory, resume from "
                     "there (--resume %s), or delete them", c->save, n, n == 1 ? "" : "s", newest, c->resume, newest);
        free(newest);
    }
}
