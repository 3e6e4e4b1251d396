/* report.c — console lines, the progress bar and the JSON-lines writer (see report.h).
 *
 * The console is for people, the JSON file for programs, so they never mix: the bar goes to stdout
 * only, is redrawn at most ~10 times a second (a terminal that scrolls at 5000 lines/s slows the
 * training it reports on), and is wiped before any other line is printed. JSON floats use %.9g:
 * nine significant digits are enough for any float32 to read back bit-exactly. */
#include "report.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h" /* checkpoint_file_checksum: which checkpoint a report's record names */
#include "errors.h"
#include "stop.h" /* stop_requested */

#define BAR_COLS 79  /* the bar line is padded to this width, so a redraw always covers the last one */
#define BAR_CELLS 24 /* "[=====>     ]" interior */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static _Noreturn void report_busy(const char *json_path) {
    die_user("--report '%s' is being written by another run (it holds the file's lock): give this run "
             "another --report file, or wait for that one to end", json_path);
}

void report_check_free(const char *json_path) {
    if (!json_path || !json_path[0]) return;
    die_if_others_file("--report", json_path);
    if (file_locked_by_another(json_path)) report_busy(json_path);
}

/* The "step" a record holds (",\"step\":N", as json_int writes it; a quote after a comma is never inside
 * a string, where json_write_str escapes it), or −1 when it has none. */
static int64_t record_step(const char *line) {
    const char *p = strstr(line, ",\"step\":");
    return p ? strtoll(p + 8, NULL, 10) : -1;
}

/* The report on fd is the log of the run that --resume continues: its last "checkpoint" record (a
 * line {"type":"checkpoint","path":"…","step":S,"checksum":"…"}, as run_save writes it) names that very
 * file, by its checksum. A run stopped by a signal says to resume with "this same command", --report
 * and all: emptying the file then lost every record of the steps before the stop.
 * What follows that record and is not the stopped run's own (the epoch's last "comm" records, its
 * summary) is superseded by this run, as PyTorch's SummaryWriter(purge_step=S + 1) drops a crashed
 * run's later events: records of steps past S (the run went on and was killed, or diverged, before
 * its next save), and every run begun after it (its "config" record: a --resume refused, or one that
 * never saved — killed, or run without --save —, an earlier resume of this checkpoint whose steps
 * another batch size may have counted from below S). *drop gets the offset of the first such line, or −1; dropped[] the first
 * and last "step" records' steps from there (0: none). */
static int report_continues(const char *json_path, const struct stat *opened, const char *resumed, int *cut,
                            off_t *drop, int64_t dropped[2]) {
    static const char head[] = "{\"type\":\"checkpoint\",\"path\":\"";
    struct stat want, got;
    int rd = open(json_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY); /* the write end cannot read */
    FILE *f = rd >= 0 && fstat(rd, &got) == 0 && got.st_dev == opened->st_dev && got.st_ino == opened->st_ino
                  ? fdopen(rd, "r") : NULL;
    if (!f) {
        if (rd >= 0) close(rd);
        return 0;
    }
    char *line = NULL, *last = NULL;
    size_t cap = 0;
    ssize_t len;
    off_t at = 0;
    int64_t saved = -1; /* the last checkpoint record's step */
    *cut = 0, *drop = -1;
    while ((len = getline(&line, &cap, f)) > 0) {
        const int64_t step = record_step(line);
        if (!strncmp(line, head, sizeof head - 1)) {
            free(last), last = xstrdup(line + sizeof head - 1);
            saved = step, *drop = -1, dropped[0] = dropped[1] = 0;
        } else if (last && *drop < 0 && ((saved >= 0 && step > saved) || !strncmp(line, "{\"type\":\"config\",", 17))) {
            *drop = at;
        }
        if (*drop >= 0 && step >= 0 && !strncmp(line, "{\"type\":\"step\",", 15)) {
            if (!dropped[0] || step < dropped[0]) dropped[0] = step;
            if (step > dropped[1]) dropped[1] = step;
        }
        *cut = line[len - 1] != '\n'; /* the last line cut short: a run killed as it wrote */
        at += (off_t)len;
    }
    free(line);
    fclose(f);
    if (!last) return 0;
    /* The file the record names: the same checksum (the record's, checkpoint_save's), wherever it is now —
     * resumed from another directory, the record's relative path leads nowhere, or elsewhere; moved, its
     * path is another — or, for a record without one (an older build's), its path, as json_write_str
     * wrote it, up to its closing quote; one it had to escape (a quote, a backslash, a control or
     * non-UTF-8 byte) is not decoded: such a report is started afresh */
    const char *ck = strstr(last, ",\"checksum\":\"");
    char *end = NULL;
    uint64_t sum = 0, was = ck ? strtoull(ck + 13, &end, 16) : 0;
    int same = 0;
    if (ck && end == ck + 29 && *end == '"') {
        same = checkpoint_file_checksum(resumed, &sum) && sum == was;
    } else {
        size_t n = strcspn(last, "\"\\");
        if (last[n] == '"' && stat(resumed, &want) == 0) {
            last[n] = 0;
            same = stat(last, &got) == 0 && got.st_dev == want.st_dev && got.st_ino == want.st_ino;
        }
    }
    free(last);
    return same;
}

void report_open(Report *r, const char *json_path, const char *progress_flag, int active) {
    report_open_resumed(r, json_path, progress_flag, active, NULL);
}

void report_open_resumed(Report *r, const char *json_path, const char *progress_flag, int active, const char *resumed) {
    memset(r, 0, sizeof *r);
    r->active = active;
    if (!active) return;
    if (!progress_flag || !strcmp(progress_flag, "auto")) r->progress = isatty(STDOUT_FILENO);
    else if (!strcmp(progress_flag, "on")) r->progress = 1;
    else if (!strcmp(progress_flag, "off")) r->progress = 0;
    else die_user("--progress must be one of auto|on|off, got '%s'", progress_flag);
    if (json_path && json_path[0]) {
        /* The type first, without truncating or blocking: a FIFO would wait forever for a reader. */
        int fd = open(json_path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0644);
        struct stat st;
        if (fd < 0 && errno == ENXIO) { /* a FIFO without a reader — or a device or socket with no one there */
            const int e = errno;
            if (stat(json_path, &st) == 0 && S_ISFIFO(st.st_mode))
                die_user("--report '%s' is a FIFO: give it a regular file", json_path);
            errno = e;
            die_user("--report '%s' cannot be opened: %s (a socket, or a device with nothing behind it, such as "
                     "/dev/tty in a run without a terminal) — give it a regular file", json_path, errno_string());
        }
        if (fd < 0) die_if_others_file("--report", json_path);
        if (fd < 0)
            die_user("cannot open --report file '%s': %s (check that its directory exists and is writable)",
                     json_path, errno_string());
        if (fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)))
            die_user("--report '%s' is not a regular file (a FIFO, socket or directory): give it a file path",
                     json_path);
        /* One run writes a report at a time: a second run's lines would interleave with the first's
         * and neither file would parse. An open-file-description lock, held until the run ends
         * (the kernel drops it however the process ends), taken before emptying the file. */
        struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (S_ISREG(st.st_mode) && fcntl(fd, F_OFD_SETLK, &lk) != 0 && (errno == EAGAIN || errno == EACCES))
            report_busy(json_path);
        int cut = 0;
        off_t drop = -1;
        int64_t dropped[2] = {0, 0};
        if (S_ISREG(st.st_mode) && resumed && resumed[0] &&
            report_continues(json_path, &st, resumed, &cut, &drop, dropped)) {
            /* a line cut short ends before this run's first, which would otherwise be glued to it */
            if ((drop >= 0 && ftruncate(fd, drop) != 0) || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_APPEND) != 0 ||
                (cut && drop < 0 && write(fd, "\n", 1) != 1))
                die_user("cannot append to --report file '%s': %s", json_path, errno_string());
            printf("note: --report '%s' is the log of the run that --resume '%s' continues (its last checkpoint "
                   "record): this run appends its records to it\n", json_path, resumed);
            if (drop >= 0 && dropped[0] > 0) {
                char steps[64];
                if (dropped[0] == dropped[1]) snprintf(steps, sizeof steps, "step %lld", (long long)dropped[0]);
                else snprintf(steps, sizeof steps, "steps %lld to %lld", (long long)dropped[0], (long long)dropped[1]);
                printf("note: --report '%s' goes on past that checkpoint, with records of %s from a run that ended "
                       "without saving them (killed, diverged, or run without --save): they are dropped, as this run "
                       "trains those steps again\n", json_path, steps);
            }
        } else if (S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0)
            die_user("cannot truncate --report file '%s': %s", json_path, errno_string());
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        r->json = fdopen(fd, "w");
        if (!r->json) die_at(__FILE__, __LINE__, "fdopen", errno_string(), json_path);
        r->json_path = json_path;
    }
    r->bar_last = -1e30;
}

/* Wipe the bar line so the next output starts at column 0 on a clean line. */
static void bar_clear(Report *r) {
    if (!r->bar_drawn) return;
    printf("\r%*s\r", BAR_COLS, "");
    r->bar_drawn = 0;
}

void report_close(Report *r) {
    if (!r->active) return;
    bar_clear(r);
    /* stdout into a file that hit a full disk or the file-size limit (SIGXFSZ is ignored: cli.c)
     * lost lines: say so where it can still be read */
    if ((fflush(stdout) != 0 || ferror(stdout)) && errno != EPIPE)
        fprintf(stderr, "warning: writing the output (stdout) failed (%s): lines are missing — check free space "
                        "(df -h) and the file-size limit (ulimit -f) where it goes\n", errno_string());
    if (r->json) {
        /* A full disk shows up here at the latest; say so rather than leave a silently short file. */
        int bad = ferror(r->json) | fclose(r->json);
        r->json = NULL;
        if (bad)
            die_runtime("writing the --report file '%s' failed (%s): it is incomplete — check free space (df -h) "
                        "and the file-size limit (ulimit -f)", r->json_path, errno_string());
    }
    r->active = 0;
}

void report_printf(Report *r, const char *fmt, ...) {
    if (!r->active) return;
    bar_clear(r);
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    vprintf(fmt, ap);
    fflush(stdout); /* people watch this live, and it may be piped through tee */
    /* stdout's reader gone during a clean stop (cli.c carries on): the step saved and the --resume
     * line must still reach the person who pressed Ctrl-C */
    if (ferror(stdout) && stop_requested()) vfprintf(stderr, fmt, again);
    va_end(again);
    va_end(ap);
}

/* "1:02:03" above an hour, else "2:03". */
static void fmt_duration(char *buf, size_t len, double s) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

void report_progress(Report *r, int epoch, int epochs, int64_t batch, int64_t batches, int64_t done,
                     double elapsed_s, const float *loss) {
    if (!r->active || !r->progress) return;
    double t = now_s();
    if (t - r->bar_last < 0.1 && batch < batches) return; /* ~10 redraws/s; always draw the last */
    r->bar_last = t;
    char cells[BAR_CELLS + 1];
    int filled = batches > 0 ? (int)((double)BAR_CELLS * (double)batch / (double)batches) : 0;
    if (filled > BAR_CELLS) filled = BAR_CELLS;
    for (int i = 0; i < BAR_CELLS; i++) cells[i] = i < filled ? '=' : ' ';
    if (filled > 0 && filled < BAR_CELLS) cells[filled - 1] = '>';
    cells[BAR_CELLS] = 0;
    char eta[32];
    double left = done > 0 ? elapsed_s / (double)done * (double)(batches - batch) : 0;
    fmt_duration(eta, sizeof eta, left);
    char line[256], lossbuf[16] = "–"; /* no loss read back yet (every --log-every steps): not a 0 */
    if (loss) snprintf(lossbuf, sizeof lossbuf, "%.4f", (double)*loss); /* "nan" once it diverges */
    int n = snprintf(line, sizeof line, "epoch %d/%d [%s] %lld/%lld  loss %s  ETA %s", epoch, epochs, cells,
                     (long long)batch, (long long)batches, lossbuf, eta);
    if (n < 0) return;
    printf("\r%-*s", BAR_COLS, line);
    fflush(stdout);
    r->bar_drawn = 1;
}

/* ----------------------------------------------------------------------------------------------
 * JSON lines */

static int json_on(const Report *r) { return r->active && r->json; }

/* The length of the well-formed UTF-8 sequence at p (1–4), or 0: a stray continuation byte, a
 * truncated sequence, an overlong form, a surrogate or a code point past U+10FFFF. */
static int utf8_len(const unsigned char *p) {
    if (p[0] < 0x80) return 1;
    int n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc0 ? 2 : 0;
    if (!n || p[0] > 0xf4 || p[0] == 0xc0 || p[0] == 0xc1) return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0; /* the NUL that ends the string fails here too */
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) || (p[0] == 0xf0 && p[1] < 0x90) ||
        (p[0] == 0xf4 && p[1] >= 0x90))
        return 0;
    return n;
}

static void json_write_str(FILE *f, const char *s) {
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p >= 0x80) { /* UTF-8 passes through; a byte that is not (a Latin-1 path) becomes U+FFFD */
            int n = utf8_len(p);
            if (n) fwrite(p, 1, (size_t)n, f), p += n - 1;
            else fputs("\\ufffd", f);
            continue;
        }
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (*p < 0x20) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}

static void json_write_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.9g", v);
    else fputs("null", f); /* JSON has no NaN/Infinity; null keeps the line parseable */
}

static void json_key(Report *r, const char *key) {
    fputc(',', r->json);
    json_write_str(r->json, key);
    fputc(':', r->json);
}

void json_begin(Report *r, const char *type) {
    if (!json_on(r)) return;
    fputs("{\"type\":", r->json);
    json_write_str(r->json, type);
}

void json_int(Report *r, const char *key, int64_t v) {
    if (!json_on(r)) return;
    json_key(r, key);
    fprintf(r->json, "%lld", (long long)v);
}

void json_num(Report *r, const char *key, double v) {
    if (!json_on(r)) return;
    json_key(r, key);
    json_write_num(r->json, v);
}

void json_str(Report *r, const char *key, const char *v) {
    if (!json_on(r)) return;
    json_key(r, key);
    json_write_str(r->json, v);
}

void json_int_list(Report *r, const char *key, const int64_t *v, int n) {
    if (!json_on(r)) return;
    json_key(r, key);
    fputc('[', r->json);
    for (int i = 0; i < n; i++) fprintf(r->json, i ? ",%lld" : "%lld", (long long)v[i]);
    fputc(']', r->json);
}

void json_num_list(Report *r, const char *key, const double *v, int n) {
    if (!json_on(r)) return;
    json_key(r, key);
    fputc('[', r->json);
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', r->json);
        json_write_num(r->json, v[i]);
    }
    fputc(']', r->json);
}

void json_end(Report *r) {
    if (!json_on(r)) return;
    fputs("}\n", r->json);
    /* a line is complete on disk once written: `tail -f` and crashes see whole lines */
    if (fflush(r->json) != 0 || ferror(r->json))
        die_runtime("writing the --report file '%s' failed (%s) — check free space (df -h) and the file-size "
                    "limit (ulimit -f)", r->json_path, errno_string());
}

/* ----------------------------------------------------------------------------------------------
 * small statistics and formatting */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double stats_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double); /* n is a few hundred timings: sorting is fine */
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double stats_median_copy(const double *v, int n) {
    if (n <= 0) return 0;
    double *tmp = xmalloc((size_t)n * sizeof(double));
    memcpy(tmp, v, (size_t)n * sizeof(double));
    double m = stats_median(tmp, n);
    free(tmp);
    return m;
}

const char *fmt_bytes(char *buf, size_t len, double bytes) {
    static const char *units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    double a = fabs(bytes);
    if (a < 1024) {
        snprintf(buf, len, "%.0f B", bytes);
        return buf;
    }
    int u = 0;
    double v = bytes / 1024;
    while (fabs(v) >= 1024 && u < 4) v /= 1024, u++;
    snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}
