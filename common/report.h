/* report.h — what the user sees: console lines, a progress bar, and JSON lines for scripts.
 *
 * Console output is for people: one header, one line per epoch, one summary block, and a progress
 * bar with ETA only when stdout is a terminal (--progress auto). JSON lines (--report FILE) are for
 * programs: {"type":"step",…}, {"type":"epoch",…}, {"type":"summary",…}; floats are written with
 * %.9g so a float32 round-trips exactly. Only the reporting rank writes (stage 3: rank 0). */
#ifndef REPORT_H
#define REPORT_H

#include <stdint.h>
#include <stdio.h>

typedef struct Report {
    FILE *json;       /* NULL when no --report */
    const char *json_path;
    int progress;     /* draw the progress bar */
    int active;       /* 0 on non-reporting ranks: every call is a no-op */
    int bar_drawn;    /* a progress line is on screen and must be cleared before printing */
    double bar_last;  /* last redraw time, to redraw at most ~10×/s */
} Report;

/* progress_flag: "auto" | "on" | "off". json_path may be "" or NULL. The file is created or
 * truncated; failure to open it, or a path that is a FIFO, socket or directory, is a user error
 * naming the path. A write that fails later (a full disk) ends the run with an error (exit 1). */
void report_open(Report *r, const char *json_path, const char *progress_flag, int active);
/* report_open for a run that continues the checkpoint `resumed` (--resume; NULL: none): a report that
 * is the log of the run that checkpoint belongs to — its last "checkpoint" record names that file, as
 * after a stop resumed with the same command — is appended to, not emptied; records after that one of
 * steps past the checkpoint's (a run killed or diverged before its next save), which this run trains
 * again, are dropped first, and a note says so; so is every run begun after it, which never saved (a
 * refused --resume, or an earlier resume of that checkpoint, killed or run without --save). */
void report_open_resumed(Report *r, const char *json_path, const char *progress_flag, int active, const char *resumed);
/* The launcher's look (stages 3–5), before any worker: json_path another run is writing, or another
 * user's file, refused with report_open's message — not after the rendezvous. Creates nothing. */
void report_check_free(const char *json_path);
void report_close(Report *r);

/* printf to stdout, clearing the progress bar first. */
void report_printf(Report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "epoch 2/5 [=====>     ] 120/390  loss 1.2345  ETA 0:12" on one line (\r), stdout only. `done` of
 * the `batch` batches ran in elapsed_s (fewer in an epoch a resume entered midway): the ETA's rate.
 * loss NULL: none read back yet ("loss –"); a diverged loss shows as "nan". */
void report_progress(Report *r, int epoch, int epochs, int64_t batch, int64_t batches, int64_t done,
                     double elapsed_s, const float *loss);

/* JSON-lines writer: begin an object of a given type, add fields, end (writes the line, flushes).
 * Calls are no-ops when there is no file. */
void json_begin(Report *r, const char *type);
void json_int(Report *r, const char *key, int64_t v);
void json_num(Report *r, const char *key, double v);  /* %.9g; non-finite → null */
void json_str(Report *r, const char *key, const char *v);
void json_int_list(Report *r, const char *key, const int64_t *v, int n);
void json_num_list(Report *r, const char *key, const double *v, int n);
void json_end(Report *r);

/* Median of v[0..n−1] (v is reordered); 0 when n == 0. */
double stats_median(double *v, int n);
/* The same without touching v (sorts a copy): for series that keep growing or are read again. */
double stats_median_copy(const double *v, int n);
/* "1.23 GiB" style, into buf (returns buf). */
const char *fmt_bytes(char *buf, size_t len, double bytes);

#endif
