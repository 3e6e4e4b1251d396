/* cli.h — one command-line parser and one configuration for every stage.
 *
 * Each flag is a row in an Option table: name, kind, destination, allowed range or choices, help.
 * cli_parse validates every value and, on a bad one, names the flag, the value and what is allowed
 * (exit 2). --help prints the table. Stages pass their own extra rows (e.g. stage 2's --gpus), and
 * the common rows below fill a TrainConfig. */
#ifndef CLI_H
#define CLI_H

#include <stddef.h>
#include <stdint.h>

typedef enum { OPT_INT, OPT_INT64, OPT_FLOAT, OPT_STR, OPT_FLAG, OPT_CHOICE } OptKind;

typedef struct Option {
    const char *name;    /* without the leading "--" */
    OptKind kind;
    void *dst;           /* int*, int64_t*, double*, const char** (STR and CHOICE), int* (FLAG → 1) */
    double min, max;     /* inclusive range for INT / INT64 / FLOAT */
    const char *choices; /* CHOICE: "a|b|c"; INT / INT64: what --help shows for an out-of-range default
                          * (NULL: "auto", a value decided later) */
    const char *help;
} Option;

/* Parses argv against opts (an array terminated by a row with name == NULL). Accepts "--name value"
 * and "--name=value". Unknown flags, missing values, unparsable numbers, out-of-range numbers and
 * values outside the choices are user errors (die_user, exit 2). Positional arguments are errors.
 * "--help" / "-h" prints `about`, then every option with its default (read from *dst before parsing)
 * and help, and exits 0. A flag given twice: the last one wins. */
void cli_parse(int argc, char **argv, const Option *opts, const char *prog, const char *about);

/* Whether the last cli_parse met --name on the command line (a default is not "given"): for flags
 * that override others, so an explicit value is refused rather than silently replaced. It reads the table
 * given to cli_parse, which must still be alive (the stages never free theirs). */
int cli_given(const char *name);
/* The value of a CHOICE or STR flag as the last cli_parse left it (its default when not given), or NULL
 * when that table has no such flag: for a check that spans two concepts' flags (amp_check reads DDP's
 * --optimizer-overlap), made once before the workers start. */
const char *cli_choice(const char *name);
/* What the "no CUDA GPU visible" note says the CPU run will train, in its parentheses: "small model, small
 * dataset" for the defaults, else what --model or --data chose instead (all of --data's images are minutes
 * of training on a CPU, and the note says how to take fewer). */
const char *cli_cpu_fallback_what(void);

/* The flags every rank of a job must agree on, as the last cli_parse left them: v[0] and v[1] name the
 * table (its flag names, their count), then one 32-bit hash per flag value — integers, so a sum over
 * ranks is exact in a double. The rest of v[0..cap) is zero, names[i] the flag of v[i] (NULL for the
 * first two). Flags that may differ between ranks (paths, --workers, --node-rank, --master-addr, …)
 * are left out (and all of them when nothing was parsed). Returns how many entries are used. DDP
 * compares them across ranks at start-up. */
int cli_job_flags(double *v, int cap, const char **names);

/* The flags cli_job_flags leaves out, as "--data, --workers, …; --trace only in its value": what the
 * refusal of a flag that differs between ranks lists as free to differ. */
const char *cli_local_flags_text(void);

/* A lesson that prints and exits (--show-sampler, --show-scaler) reads only its own flags (`uses`,
 * NULL-terminated); any other flag on the command line would be silently ignored, so it is refused,
 * naming it and what the lesson prints (`prints`) — all but --device, --master-port, --master-addr
 * and --progress, which change nothing a lesson prints. */
void cli_lesson_flags(const char *lesson, const char *prints, const char *const *uses);

/* The configuration every stage shares. Defaults are applied by config_defaults; values that depend
 * on the device (model, dataset sizes, epochs) are left "auto" (empty string / −1) until
 * config_resolve, once the device kind is known. */
typedef struct TrainConfig {
    const char *device;      /* auto | cuda | cpu */
    const char *model;       /* "" (auto: resnet18 on CUDA, tiny on CPU) | resnet18 | tiny */
    const char *norm;        /* bn | none */
    int epochs;              /* −1 = auto (5 on CUDA, 4 on CPU) */
    int64_t steps;           /* stop after this many optimizer steps; 0 = no limit */
    int batch_size;          /* per device */
    int accum_steps;         /* micro-batches per optimizer step (stages 4–5's --accum-steps); 0 = no accumulation */
    double lr, momentum, weight_decay;
    const char *schedule;    /* const | cosine (over the whole run) */
    int64_t warmup_steps;    /* linear warm-up over this many optimizer steps first (0: none) */
    double warmup_start_factor; /* the warm-up's first lr, as a fraction of lr (0 once resolved without one) */
    double clip_grad_norm;   /* > 0: clip_grad_norm_(parameters, this) before each optimizer step (clip.h) */
    int64_t seed;
    int log_every;
    int deterministic;
    int cudnn_benchmark;
    int no_tf32;
    int no_cuda_graph;       /* run the training step's launches one by one (model_default_graphs) */
    const char *layout;      /* auto | nhwc | nchw: activations on the GPU (model_default_layout) */
    const char *data;        /* "" = synthetic; else CIFAR-10 binary directory */
    int64_t train_size;      /* −1 = auto (all of CIFAR-10; synthetic: 50000 GPU / 8192 CPU) */
    int64_t test_size;       /* −1 = auto (10000 GPU / 1024 CPU) */
    int64_t data_train_records; /* --data: the training records its files hold (config_resolve); else 0 */
    int64_t data_test_records;  /* --data: the test records, likewise */
    int workers;
    int cpu_threads;         /* −1 = auto (cpu_threads_auto); the CPU backend's intra-op threads */
    int pin_memory;
    const char *save;        /* "" = no checkpoints; else a directory */
    int keep_last;           /* 0 = keep every checkpoint this run writes; N = only the newest N */
    const char *resume;      /* "" or a checkpoint file */
    int evaluate;            /* test --resume's model on the test set and train nothing */
    const char *report;      /* "" or a JSON-lines file */
    const char *progress;    /* auto | on | off */
    const char *optimizer;   /* sgd | adam (torch.optim.SGD / torch.optim.Adam) */
    const char *trace;       /* "" = off; else a Chrome trace-event JSON file (trace.h) */
    const char *trace_steps; /* "A:B": the optimizer steps traced */
} TrainConfig;

/* A new table: the n rows, then the rows of `more` (NULL, or terminated by a row with name == NULL),
 * then the terminating row. How a module adds its flags in front of a stage's (ddp_options,
 * amp_options). Option tables live until the program exits; every one made here stays reachable
 * (so leak checkers do not report them). */
Option *cli_rows(const Option *rows, size_t n, const Option *more);

void config_defaults(TrainConfig *c);
/* The common option rows for c; `extra` (may be NULL) rows are appended. Returns a malloc'd,
 * terminated table. */
Option *config_options(TrainConfig *c, const Option *extra);
/* Fill "auto" values for the device kind (cuda = 1 / cpu = 0) and check cross-flag rules and paths
 * (e.g. --keep-last without --save, --momentum with --optimizer adam, a missing --data directory,
 * --evaluate without --resume or with a flag that only training reads).
 * saver: this process writes --save's checkpoints (stages 1 and 2; rank 0 of stages 3–5, never their
 * launcher): it takes the directory's lock for the rest of its life (checkpoint_lock), before it
 * checks what the directory holds. */
void config_resolve(TrainConfig *c, int cuda, int saver);
/* The directory path's file will be created in takes a new file (a file of this process's own name is
 * made there and removed): refused, naming flag and the fix (example: a file name to suggest), when it
 * does not — no write permission, a read-only mount, /proc or /sys. A device (/dev/null) passes, and so
 * does an existing file that is written in place (in_place: --report; --trace writes FILE.tmp first).
 * A path that is a directory (--save DIR) is checked itself: its files go in it. */
void cli_check_dir_takes_files(const char *flag, const char *path, const char *example, int in_place);
/* What --evaluate makes of a flag: 1 it still counts (what the model is, how its forward runs, the
 * test data, where the job runs, what is reported), 0 only training reads it (refused with
 * --evaluate), −1 a flag this list does not know yet (a test keeps every stage's table classified). */
int cli_evaluate_keeps(const char *name);
/* The stages that have flag `name` when not all do ("2", "3–5", "4–5", "5"; *idea, when idea is not
 * NULL: what they add, e.g. "DDP"), or NULL (every stage's, or no stage's): how an unknown option is
 * explained. */
const char *cli_flag_stages(const char *name, const char **idea);

#endif
