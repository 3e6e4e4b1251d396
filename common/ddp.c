/* ddp.c — DDP's flags, its reducer (bucket plans, the gradient-ready hook, no_sync, unused parameters and
 * find_unused_parameters), buffer broadcasts, sharded evaluation, and the communication statistics
 * (see ddp.h). */
#include "ddp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "hash.h"
#include "launch.h"
#include "ops.h"
#include "report.h"
#include "syncbn.h"
#include "trace.h"

/* ---- the flags ------------------------------------------------------------------------------- */

Option *ddp_options(DdpFlags *f, const Option *extra) {
    *f = (DdpFlags){.nnodes = 1, .master_addr = "127.0.0.1", .master_port = 29500, .comm = "auto",
                    .bucket_mb = 25, .broadcast_buffers = "before-forward", .optimizer_overlap = "off", .rdzv_timeout = 60, .comm_timeout = 300,
                    .show = {.world_size = 1, .dataset_size = -1}};
    const double above0 = nextafter(0.0, INFINITY); /* shown as the open end of (0, …] */
    const Option rows[] = {
        {"nproc-per-node", OPT_INT, &f->nproc_per_node, 1, 1024, NULL,
         "worker processes on this node (torchrun --nproc-per-node); auto: one per visible GPU, 2 on the CPU"},
        {"nnodes", OPT_INT, &f->nnodes, 1, 65536, NULL, "machines in the job (torchrun --nnodes)"},
        {"node-rank", OPT_INT, &f->node_rank, 0, 65535, NULL,
         "this machine's number, 0 … nnodes−1 (torchrun --node-rank)"},
        {"master-addr", OPT_STR, &f->master_addr, 0, 0, NULL,
         "address of node 0, where rank 0 hosts the rendezvous store (torchrun --master-addr)"},
        {"master-port", OPT_INT, &f->master_port, 1, 65535, NULL,
         "TCP port of the rendezvous store (torchrun --master-port)"},
        {"standalone", OPT_FLAG, &f->standalone, 0, 0, NULL,
         "a job of one node on a free port of its own instead of --master-port (torchrun --standalone): on a "
         "machine shared with other jobs, where 29500 may be taken"},
        {"comm", OPT_CHOICE, &f->comm, 0, 0, "auto|nccl|host",
         "all-reduce backend: nccl (GPUs), or host = a ring over TCP through host memory (CPU workers; GPU "
         "workers sharing a GPU), like gloo; auto: nccl on GPUs"},
        {"bucket-mb", OPT_FLOAT, &f->bucket_mb, above0, 1e6, NULL,
         "gradient bucket size in MiB (DistributedDataParallel bucket_cap_mb); left out, the first bucket (the "
         "one rebuilt after step 1, or --find-unused-parameters' from the start) closes at the first tensor "
         "reaching 1 MiB, as PyTorch's does; given, every bucket is capped at it"},
        {"last-bucket-mb", OPT_FLOAT, &f->last_bucket_mb, 0, 1e6, NULL,
         "ours, not PyTorch's: make the last bucket (the one all-reduced after backward, in the open) the smallest "
         "that holds this many MiB; 0: whatever the other buckets leave (PyTorch)"},
        {"broadcast-buffers", OPT_CHOICE, &f->broadcast_buffers, 0, 0, "before-forward|after-forward",
         "when rank 0's BN buffers are broadcast: before the next forward, which waits for it (PyTorch's default), "
         "or from the first gradient hook of the synchronising backward, overlapped with it (modelled on PyTorch's "
         "POST_FORWARD buffer hook, which fires after other forwards); the same values as before-forward"},
        {"no-overlap", OPT_FLAG, &f->no_overlap, 0, 0, NULL,
         "all-reduce all gradients once after backward instead of bucket by bucket during it (the experiment)"},
        {"optimizer-overlap", OPT_CHOICE, &f->optimizer_overlap, 0, 0, "off|in-backward|after-backward",
         "off: optimizer.step() after backward; in-backward: ddp_model._register_fused_optim, each bucket stepped "
         "as soon as its all-reduce is done, on a side stream while backward goes on; after-backward (ours): each "
         "bucket stepped after backward as soon as its all-reduce is done, beside the last all-reduce (not with "
         "--clip-grad-norm, --no-overlap, stages 4–5's --sync-each-micro-step, or stage 5's --grad-stats, "
         "--no-grad-scaler and fp16's GradScaler)"},
        {"find-unused-parameters", OPT_FLAG, &f->find_unused, 0, 0, NULL,
         "DistributedDataParallel(find_unused_parameters=True): every step, find the parameters the forward did "
         "not use and mark them ready (the price: that search, their zero gradients all-reduced, one more "
         "all-reduce of a used-parameter map, no bucket rebuild)"},
        {"unused-param", OPT_FLAG, &model_unused_param, 0, 0, NULL,
         "the pitfall: give the model a second classifier head, fc_unused, that the forward never uses (DDP "
         "stops at the next step unless --find-unused-parameters)"},
        {"sync-bn", OPT_FLAG, &f->sync_bn, 0, 0, NULL,
         "nn.SyncBatchNorm.convert_sync_batchnorm(model): batch norm's training statistics over every rank's "
         "batch, so R ranks at batch B normalise like one device at batch R·B (without it, each rank over its "
         "own B). The price: two small collectives per batch-norm layer and forward + backward that the compute "
         "waits for, and no CUDA graphs. Unlike PyTorch's, it also runs on CPU workers"},
        {"drop-last", OPT_FLAG, &f->drop_last, 0, 0, NULL,
         "DistributedSampler(drop_last=True): drop the tail instead of padding every rank to the same length"},
        {"rdzv-timeout", OPT_FLOAT, &f->rdzv_timeout, 1, 3600, NULL, "seconds to wait for every rank to join"},
        {"comm-timeout", OPT_FLOAT, &f->comm_timeout, 1, 86400, NULL,
         "seconds before an unfinished collective counts as hung and the job is stopped "
         "(init_process_group timeout)"},
        {"show-sampler", OPT_FLAG, &f->show.show, 0, 0, NULL,
         "print one rank's DistributedSampler indices (with --dataset-size, --world-size, --rank, --epoch, "
         "--seed, --drop-last, --no-shuffle) and exit"},
        {"dataset-size", OPT_INT64, &f->show.dataset_size, 1, 1e12, "none",
         "--show-sampler: dataset length N (required: the lesson reads no data)"},
        {"world-size", OPT_INT, &f->show.world_size, 1, 65536, NULL, "--show-sampler: number of ranks R"},
        {"rank", OPT_INT, &f->show.rank, 0, 65535, NULL, "--show-sampler: the rank whose indices to print"},
        {"epoch", OPT_INT64, &f->show.epoch, 0, 1e9, NULL, "--show-sampler: the epoch (sampler.set_epoch)"},
        {"no-shuffle", OPT_FLAG, &f->no_shuffle, 0, 0, NULL,
         "DistributedSampler(shuffle=False): indices in order"},
    };
    return cli_rows(rows, sizeof rows / sizeof rows[0], extra);
}

/* T_FWD_BEGIN: after the buffer broadcast (if any) has been waited for, so it also ends T_PRE_BCAST's span;
 * T_WAIT_BEGIN: --optimizer-overlap after-backward, after the steps that run beside the last all-reduce */
enum { T_BWD_END, T_AFTER_WAIT, T_PRE_BCAST, T_FWD_BEGIN, T_WAIT_BEGIN, N_MARKS };

/* ---- small helpers --------------------------------------------------------------------------- */

static void series_push(DdpSeries *s, double v) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->v = xrealloc(s->v, (size_t)s->cap * sizeof(double));
    }
    s->v[s->n++] = v;
}

static double series_median(const DdpSeries *s) { return stats_median_copy(s->v, s->n); }

/* "3 buckets: 9.02 MiB, 25.27 MiB, 8.33 MiB" (ResNet-18's rebuilt default) */
static void describe(const Ddp *d, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "%d bucket%s:", d->n_buckets, d->n_buckets == 1 ? "" : "s");
    for (int b = 0; b < d->n_buckets && used < len; b++) {
        char sz[32];
        if (b == 12 && d->n_buckets > 13) {
            snprintf(buf + used, len - used, " … (%d more)", d->n_buckets - 12);
            return;
        }
        fmt_bytes(sz, sizeof sz, 4.0 * (double)d->buckets[b].count);
        used += (size_t)snprintf(buf + used, len - used, "%s %s", b ? "," : "", sz);
    }
}

/* ---- bucket plans ---------------------------------------------------------------------------- */

/* Every bucket is a contiguous slice and together they tile the gradient buffer, so a parameter's
 * bucket is the one whose slice holds its offset. */
static void index_buckets(Ddp *d) {
    Model *m = d->m;
    for (int b = 0; b < d->n_buckets; b++) d->buckets[b].n_params = 0;
    for (int p = 0; p < m->n_params; p++) {
        int b = 0;
        while (!(m->params[p].offset >= d->buckets[b].offset &&
                 m->params[p].offset < d->buckets[b].offset + d->buckets[b].count))
            b++;
        d->bucket_of[p] = b;
        d->buckets[b].n_params++;
    }
    for (int b = 0; b < d->n_buckets; b++) d->buckets[b].pending = d->buckets[b].n_params;
    d->next = 0;
    /* A launch happens only when a bucket's last gradient is ready: backward needs to stop for the
     * hook only there (model_set_hook_stops: each stop is one more CUDA graph launch). */
    unsigned char *stop = xcalloc((size_t)m->n_params, 1);
    int *last = xmalloc((size_t)d->n_buckets * sizeof *last), *at = xmalloc((size_t)d->n_buckets * sizeof *at);
    for (int b = 0; b < d->n_buckets; b++) last[b] = at[b] = -1;
    for (int p = 0; p < m->n_params; p++) { /* each bucket's member that backward reports last */
        int b = d->bucket_of[p], pt = model_hook_point(m, p);
        if (pt > at[b]) at[b] = pt, last[b] = p;
    }
    for (int b = 0; b < d->n_buckets && d->overlap; b++)
        if (last[b] >= 0) stop[last[b]] = 1;
    model_set_hook_stops(m, stop);
    free(stop), free(last), free(at);
}

/* Group parameters, in the given order, into buckets: a bucket closes once it holds at least its
 * limit (the first `first_limit`, the rest cap_bytes) — PyTorch's _compute_bucket_assignment_by_size
 * — and its parameters form one contiguous slice of the buffer; with `last_limit` (--last-bucket-mb),
 * a tail of the order goes last, on its own. Returns 0 if the last bucket would not be contiguous (an
 * order our models never produce); the plan is then left unchanged. */
static int plan(Ddp *d, const int *order, size_t first_limit, size_t last_limit) {
    Model *m = d->m;
    DdpBucket *nb = xcalloc((size_t)m->n_params, sizeof *nb);
    int n = 0, members = 0;
    int64_t lo = INT64_MAX, hi = 0, count = 0;
    /* --last-bucket-mb: the shortest contiguous tail of the order holding at least last_limit (at
     * least one parameter is left to the others) */
    int split = m->n_params;
    size_t most = 0; /* the largest contiguous tail short of the whole order, for the note */
    for (int i = m->n_params - 1; i > 0 && last_limit; i--) {
        const Param *p = &m->params[order[i]];
        if (p->offset < lo) lo = p->offset;
        if (p->offset + p->count > hi) hi = p->offset + p->count;
        count += p->count;
        if (hi - lo == count && (size_t)count * sizeof(float) > most) most = (size_t)count * sizeof(float);
        if ((size_t)count * sizeof(float) >= last_limit && hi - lo == count) {
            split = i;
            break;
        }
    }
    DdpBucket tail = {.offset = lo, .count = count};
    lo = INT64_MAX, hi = 0, count = 0;
    size_t limit = first_limit;
    for (int i = 0; i < split; i++) {
        const Param *p = &m->params[order[i]];
        if (p->offset < lo) lo = p->offset;
        if (p->offset + p->count > hi) hi = p->offset + p->count;
        count += p->count, members++;
        int contiguous = hi - lo == count;
        if ((size_t)count * sizeof(float) >= limit && contiguous) {
            nb[n++] = (DdpBucket){.offset = lo, .count = count};
            lo = INT64_MAX, hi = 0, count = 0, members = 0;
            limit = d->cap_bytes;
        }
    }
    if (members) {
        if (hi - lo != count) {
            free(nb);
            return 0;
        }
        nb[n++] = (DdpBucket){.offset = lo, .count = count};
    }
    if (split < m->n_params) nb[n++] = tail;
    d->last_cut = split < m->n_params;
    if (last_limit) d->last_most = most; /* a plan without a tail leaves the note's figure alone */
    free(d->buckets);
    d->buckets = nb;
    d->n_buckets = n;
    index_buckets(d);
    return 1;
}

/* find_unused_parameters: PyTorch never rebuilds, and plans at construction as
 * _compute_bucket_assignment_by_size does: the parameters in forward (registration) order, the first
 * bucket at first_bytes, then the list reversed — so the first layers' small bucket is all-reduced
 * last (ResNet-18: 9.03, 32.18, 1.42 MiB; tests/fixtures/ddp_buckets.txt). */
static void plan_forward_reversed(Ddp *d) {
    Model *m = d->m;
    int *forward = xmalloc((size_t)m->n_params * sizeof(int));
    for (int i = 0; i < m->n_params; i++) forward[i] = i;
    ASSERT(plan(d, forward, d->first_bytes, 0)); /* registration order is the buffer's: always contiguous */
    free(forward);
    for (int a = 0, b = d->n_buckets - 1; a < b; a++, b--) {
        DdpBucket t = d->buckets[a];
        d->buckets[a] = d->buckets[b], d->buckets[b] = t;
    }
    index_buckets(d);
}

/* A --last-bucket-mb that no tail short of the whole order holds leaves the plan PyTorch's: said, with
 * the most a last bucket can hold in that order (rounded down to 4 digits, so the value given fits). */
static void last_note(const Ddp *d, const char *order) {
    char want[32], most[32], fix[96];
    fmt_bytes(want, sizeof want, (double)d->last_bytes);
    if (d->last_most) {
        double v = (double)d->last_most / 1048576.0, unit = pow(10, floor(log10(v)) - 3);
        fmt_bytes(most, sizeof most, (double)d->last_most);
        snprintf(fix, sizeof fix, "give --last-bucket-mb %.4g or less (at most %s here)", floor(v / unit) * unit, most);
    } else snprintf(fix, sizeof fix, "drop --last-bucket-mb (no tail short of the whole model here)");
    report_printf(&d->run->report, "ddp: note: --last-bucket-mb asks for %s, more than any tail of the %s order "
                  "holds while leaving one parameter to the other buckets, so there is no last bucket of its own — "
                  "%s, or 0\n", want, order, fix);
}

/* After the first step: rank 0's gradient-ready order (so every rank gets the same buckets, as
 * PyTorch syncs its rebuilt bucket indices from rank 0), the first bucket at first_bytes. */
static void rebuild(Ddp *d) {
    Model *m = d->m;
    ASSERT(m->n_params <= 512);
    double v[512] = {0};
    if (d->rank == 0)
        for (int i = 0; i < m->n_params; i++) v[i] = d->ready_order[i];
    comm_sum_doubles(d->comm, v, m->n_params);
    /* Rank 0's order must be a permutation of the parameters; anything else means the ranks' messages
     * got out of step (they issued different collectives) — stop before planning with it. */
    unsigned char seen[512] = {0};
    for (int i = 0; i < m->n_params; i++) {
        int p = (int)v[i];
        if (v[i] != p || p < 0 || p >= m->n_params || seen[p]++)
            die_collateral(d->rank != 0, 1, "rank %d: rank 0's gradient-ready order arrived garbled (entry %d is %g): "
                           "the ranks issued different collectives — start every rank with the same binary and flags",
                           d->rank, i, v[i]);
        d->ready_order[i] = p;
    }
    d->rebuilt = 1;
    char desc[512];
    int was_cut = d->last_cut;
    if (!plan(d, d->ready_order, d->first_bytes, d->last_bytes)) {
        report_printf(&d->run->report,
                      "ddp: gradient-ready order does not give contiguous buckets; keeping the reverse-order plan\n");
        return;
    }
    describe(d, desc, sizeof desc);
    /* The backward that gave the order ended an optimizer step, or (--sync-each-micro-step) the first
     * micro-step of one still accumulating: then no step has ended yet to name. */
    char when[96];
    if (d->group_step > d->run->step)
        snprintf(when, sizeof when, "during step %lld, after its first micro-step", (long long)d->group_step);
    else snprintf(when, sizeof when, "after step %lld", (long long)d->run->step);
    report_printf(&d->run->report, "ddp: %s%s, buckets rebuilt in gradient-ready order (first cap %s%s)%s: %s\n",
                  when, d->run->resumed_at_step ? " (this run's first)" : "",
                  d->first_bytes == d->cap_bytes ? "= --bucket-mb, as PyTorch's when bucket_cap_mb is given" : "1 MiB",
                  d->last_cut ? ", last as before" : d->last_bytes ? ", no last bucket of its own" : "",
                  d->overlap ? "" : ", unused under --no-overlap", desc);
    if (d->last_bytes && !d->last_cut && was_cut && d->overlap) last_note(d, "gradient-ready");
}

/* ---- timing points ---------------------------------------------------------------------------- */

static void mark(Ddp *d, DdpStep *s, int i) { timemark_record(&s->at[i], d->dev); }

static double elapsed_ms(Ddp *d, DdpStep *s, int a, int b) { return timemark_ms(&s->at[a], &s->at[b]); }

static double busbw_factor(int n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; }

/* One optimizer step's micro-steps have all been read back: into the medians (after warm-up) and,
 * every --log-every steps, a "comm" record. */
static void flush_group(Ddp *d) {
    DdpGroup *g = &d->group;
    if (!g->micro) return;
    if (d->groups_seen++ >= WARMUP_STEPS) {
        series_push(&d->ar, g->ar), series_push(&d->ar_run, g->ar);
        series_push(&d->exposed, g->exposed), series_push(&d->exposed_run, g->exposed);
        series_push(&d->bcast, g->bc), series_push(&d->bcast_run, g->bc);
        series_push(&d->fb_run, g->fb);
    }
    Report *r = &d->run->report;
    if (g->step % d->run->cfg->log_every == 0) {
        double algbw = g->ar > 0 ? (double)g->bytes / (g->ar * 1e6) : 0; /* GB/s */
        json_begin(r, "comm");
        json_int(r, "step", g->step);
        json_int(r, "micro_steps", g->micro);
        json_num(r, "allreduce_ms", g->ar);
        json_num(r, "exposed_ms", g->exposed + g->bc);
        json_num(r, "exposed_backward_ms", g->exposed);
        json_num(r, "bcast_ms", g->bc);
        json_int(r, "bytes", g->bytes);
        json_int(r, "collectives", g->n_ops);
        json_int(r, "broadcasts", g->bcasts);
        json_num(r, "algbw_gbps", algbw);
        json_num(r, "busbw_gbps", algbw * busbw_factor(d->world));
        json_end(r);
    }
    memset(g, 0, sizeof *g);
}

/* --optimizer-overlap after-backward, registered: the earlier buckets are stepped after backward,
 * beside the last all-reduce, and the exposed wait starts after them (T_WAIT_BEGIN). */
static int steps_after_backward(const Ddp *d) {
    return d->fused_optim && d->overlap_optim == DDP_OPTIM_AFTER_BACKWARD;
}

/* Read a finished micro-step's timings back (it is DDP_STATS_LAG micro-steps old: no real wait)
 * and add them to its optimizer step's. */
static void harvest(Ddp *d, DdpStep *s) {
    if (!s->pending) return;
    s->pending = 0;
    double ar = 0, exposed = 0;
    for (int64_t i = 0; i < s->n_ops; i++) ar += comm_op_ms(d->comm, s->ops[i]);
    double fb = 0;
    int wait_from = steps_after_backward(d) ? T_WAIT_BEGIN : T_BWD_END;
    /* forward + backward of every micro-step, so an optimizer step's is the same with or without
     * no_sync (a rank's micro-steps all count towards when it reaches the all-reduce) */
    fb = elapsed_ms(d, s, T_FWD_BEGIN, T_BWD_END);
    if (s->synced) exposed = elapsed_ms(d, s, wait_from, T_AFTER_WAIT);
    /* the wait before the forward; after-forward, no one waits for the broadcast but the backward's end */
    double bc = s->bcast_op >= 0 && !d->bcast_after ? elapsed_ms(d, s, T_PRE_BCAST, T_FWD_BEGIN) : 0;
    if (exposed < 0) exposed = 0;
    if (d->group.micro && d->group.step != s->step) flush_group(d);
    DdpGroup *g = &d->group;
    g->step = s->step;
    g->micro++;
    g->ar += ar, g->exposed += exposed, g->bc += bc, g->fb += fb;
    g->bytes += s->bytes, g->n_ops += s->n_ops, g->bcasts += s->bcast_op >= 0;
}

static DdpStep *step_of(Ddp *d, int64_t iter) { return &d->steps[iter % (DDP_STATS_LAG + 1)]; }

/* At a group boundary (epoch end, run end): read back everything, close the last optimizer step. */
static void harvest_all(Ddp *d) {
    for (int64_t i = d->iteration - DDP_STATS_LAG; i < d->iteration; i++)
        if (i >= 0) harvest(d, step_of(d, i));
    flush_group(d);
}

/* Every flag a rank must share (cli_job_flags), compared across ranks; the first that differs is
 * named. The vector has the same length on every rank whatever the stage, so the sum itself is safe. */
static void check_job_flags(Ddp *d) {
    enum { CAP = 160 };
    double mine[CAP], all[CAP];
    const char *names[CAP];
    int n = cli_job_flags(mine, CAP, names);
    memcpy(all, mine, sizeof all);
    comm_sum_doubles(d->comm, all, CAP);
    if (all[0] != mine[0] * d->world || all[1] != mine[1] * d->world)
        die_collateral(d->rank != 0, 2, "rank %d: the ranks run different programs (another stage, or a build of "
                       "other sources) — start every rank from the same binary, or builds of the same sources", d->rank);
    for (int i = 2; i < n; i++)
        if (all[i] != mine[i] * d->world)
            die_collateral(d->rank != 0, 2, "rank %d: the ranks were started with different --%s — start every rank "
                           "with the same flags (only %s may differ)", d->rank, names[i], cli_local_flags_text());
}

/* ---- the interface --------------------------------------------------------------------------- */

void ddp_init(Ddp *d, Run *run, Comm *comm, const DdpFlags *f) {
    memset(d, 0, sizeof *d);
    Model *m = run->model;
    int overlap = !f->no_overlap;
    d->run = run, d->m = m, d->comm = comm, d->dev = m->dev;
    d->rank = run->rank, d->world = run->world_size, d->overlap = overlap;
    d->overlap_optim = !strcmp(f->optimizer_overlap, "in-backward")      ? DDP_OPTIM_IN_BACKWARD
                       : !strcmp(f->optimizer_overlap, "after-backward") ? DDP_OPTIM_AFTER_BACKWARD
                                                                         : DDP_OPTIM_OFF;
    ASSERT(!d->overlap_optim || (overlap && !f->sync_each_micro_step)); /* refused by config_resolve */
    d->sync = 1, d->forward_param_sync = 1; /* as a freshly constructed DistributedDataParallel */
    d->cap_bytes = (size_t)(f->bucket_mb * 1048576.0);
    if (d->cap_bytes < sizeof(float)) d->cap_bytes = sizeof(float);
    /* DistributedDataParallel caps its first bucket at 1 MiB only when bucket_cap_mb is left out
     * (bucket_bytes_cap_default); a cap of the user's own, 25 included, caps the first bucket too */
    d->first_bytes = f->bucket_mb_given || cli_given("bucket-mb") ? d->cap_bytes : DDP_FIRST_BUCKET_BYTES;
    d->last_bytes = (size_t)(f->last_bucket_mb * 1048576.0);
    /* under a byte, yet given: the smallest tail (one parameter) — not 0, which is PyTorch's plan */
    if (f->last_bucket_mb > 0 && !d->last_bytes) d->last_bytes = 1;
    d->bcast_after = !strcmp(f->broadcast_buffers, "after-forward");

    /* DDP's constructor checks that every rank built the same model. We also check the flags: ranks
     * that disagree would train different things, or issue different collectives and wait for each
     * other forever (or read each other's messages as their own). First every flag as given… */
    check_job_flags(d);
    /* …then what they resolved to ("auto" sizes and epochs depend on the device kind). */
    const TrainConfig *c = run->cfg;
    char flags[256];
    /* the first bucket's cap too: --bucket-mb 25 typed and left out are one value but two plans */
    snprintf(flags, sizeof flags, "%d %d %lld %d %lld %lld %lld %d %zu %zu %d %d %d", c->batch_size, c->epochs,
             (long long)c->steps, c->log_every, (long long)c->train_size, (long long)c->test_size, (long long)c->seed,
             overlap, d->cap_bytes, d->first_bytes, c->accum_steps, f->sync_each_micro_step, f->find_unused);
    uint64_t h = m->shape_hash, hf = fnv1a64(FNV1A64_INIT, flags, strlen(flags));
    /* …and the data each rank opened: --data is a node's own path, so one node may read CIFAR-10, or
     * another copy of it, while the other reads the synthetic set */
    char data[160];
    uint64_t hd = data_signature(data, sizeof data);
    double mine[7] = {(double)(h & 0xffffffu), (double)(h >> 40), (double)m->n_param_floats,
                      (double)(hf & 0xffffffu), (double)(hf >> 40), (double)(hd & 0xffffffu), (double)(hd >> 40)},
           all[7];
    memcpy(all, mine, sizeof all);
    comm_sum_doubles(comm, all, 7);
    for (int i = 0; i < 3; i++)
        if (all[i] != mine[i] * d->world)
            die_collateral(d->rank != 0, 2, "rank %d: the ranks built different models (architecture, --norm or "
                           "parameter shapes differ) — start every rank with the same flags", d->rank);
    for (int i = 3; i < 5; i++)
        if (all[i] != mine[i] * d->world)
            die_collateral(d->rank != 0, 2, "rank %d: the ranks were started with different training flags "
                           "(--batch-size, --epochs, --steps, --log-every, --train-size, --test-size, --seed, "
                           "--bucket-mb or whether it is given, --no-overlap, --accum-steps, --sync-each-micro-step or "
                           "--find-unused-parameters) — start every rank with the same flags", d->rank);
    for (int i = 5; i < 7; i++)
        if (all[i] != mine[i] * d->world)
            die_collateral(d->rank != 0, 2, "rank %d: the ranks read different data (this one: %s) — give every "
                           "node the same --data (a copy of the same CIFAR-10 files), or none", d->rank, data);
    /* …and, when tracing, whether rank 0 will find every rank's timeline: it merges them from its own
     * --trace path, so a node that traces to another path, or to a disk rank 0 does not share, would
     * fail the run only at its end. Every rank has opened its file (run_begin) once past the barrier. */
    if (trace_wants_merge()) {
        double v[1] = {0};
        comm_barrier(comm, "every rank's trace file opened");
        for (int r = 1; r < d->world && d->rank == 0 && !v[0]; r++)
            if (!trace_rank_file_seen(r)) v[0] = r;
        comm_sum_doubles(comm, v, 1); /* rank 0's verdict: the first rank whose file it cannot see, or 0 */
        if (v[0])
            die_collateral(d->rank != 0, 2, "rank %d: --trace: rank 0 cannot see rank %.0f's timeline, which it "
                           "merges from its own --trace path (NAME.rankN.json) — give every node the same --trace, "
                           "on a file system they share (a job on one node shares its disk)", d->rank, v[0]);
    }
    run_sampler(run, !f->no_shuffle, f->drop_last); /* DistributedSampler's flags: a --resume is checked now */
    /* Test-only (STAGE3_TEST_SKEW_INIT): the other ranks start from other weights, so that only the
     * broadcast below can make the replicas equal (every rank builds its model from the same --seed). */
    if (d->rank != 0 && getenv("STAGE3_TEST_SKEW_INIT")) {
        scale_inplace(d->dev, m->n_param_floats, m->param_flat, 1.5f);
        if (m->n_buffer_floats) scale_inplace(d->dev, m->n_buffer_floats, m->buffer_flat, 3.0f);
    }
    /* …and makes every replica start from rank 0's parameters and buffers. */
    comm_broadcast_async(comm, m->param_flat, m->n_param_floats, 0);
    if (m->n_buffer_floats) comm_broadcast_async(comm, m->buffer_flat, m->n_buffer_floats, 0);
    comm_wait(comm);

    d->bucket_of = xcalloc((size_t)m->n_params, sizeof(int));
    d->ready_order = xcalloc((size_t)m->n_params, sizeof(int));
    d->got = xcalloc((size_t)m->n_params, 1);
    d->find_unused = f->find_unused;
    if (d->find_unused) {
        d->reached = xcalloc((size_t)m->n_acts, 1);
        d->reached_p = xcalloc((size_t)m->n_params, 1);
        d->unused = xcalloc((size_t)m->n_params, sizeof(int));
        d->used_pinned = host_alloc(d->dev, (DDP_STATS_LAG + 1) * (size_t)m->n_params * sizeof(float), 1);
        d->used_dev = device_alloc(d->dev, (size_t)m->n_params * sizeof(float), "DDP used-parameter map");
        d->used_back = xcalloc((size_t)m->n_params, sizeof(float));
    }
    /* PyTorch's plan under find_unused_parameters; --last-bucket-mb's tail is cut from the end of the
     * order, so it needs the reverse order, whose end is what backward reaches last */
    int fwd = d->find_unused && !d->last_bytes;
    if (fwd) plan_forward_reversed(d);
    else { /* reverse parameter order, every bucket at the cap (and --last-bucket-mb's tail, ours) */
        int *reverse = xmalloc((size_t)m->n_params * sizeof(int));
        for (int i = 0; i < m->n_params; i++) reverse[i] = m->n_params - 1 - i;
        ASSERT(plan(d, reverse, d->cap_bytes, d->last_bytes)); /* reverse order is always contiguous */
        free(reverse);
        /* no tail holds --last-bucket-mb: the plan it would be at 0 */
        if (d->find_unused && !d->last_cut) plan_forward_reversed(d), fwd = 1;
    }
    for (int s = 0; s <= DDP_STATS_LAG; s++)
        for (int i = 0; i < N_MARKS; i++) timemark_init(&d->steps[s].at[i], d->dev);
    for (int s = 0; s <= DDP_STATS_LAG; s++) d->steps[s].ops = xmalloc(((size_t)m->n_params + 2) * sizeof(int64_t));
    if (c->evaluate) return; /* --evaluate: no backward, so no buckets, no_sync or hooks to describe */
    char desc[512], cap[32], last[64] = "";
    describe(d, desc, sizeof desc);
    fmt_bytes(cap, sizeof cap, (double)d->cap_bytes);
    if (d->last_bytes && d->last_cut) {
        char lb[32];
        fmt_bytes(lb, sizeof lb, (double)d->last_bytes);
        snprintf(last, sizeof last, ", last the smallest ≥ %s", lb);
    } else if (d->last_bytes) snprintf(last, sizeof last, ", no last bucket of its own");
    report_printf(&run->report, "ddp: %d rank%s, %s | %s | gradients %s: %s (%s, %scap %s%s)\n",
                  d->world, d->world == 1 ? "" : "s", comm_describe(comm), overlap ? "all-reduce overlapped with backward"
                                                          : "--no-overlap: one all-reduce after backward",
                  overlap ? "in buckets" : "bucket plan (unused)", desc,
                  fwd ? "cut in parameter order, then reversed" : "reverse parameter order",
                  fwd && d->first_bytes != d->cap_bytes ? "first cap 1 MiB, " : "", cap, last);
    if (d->last_bytes && !d->last_cut && overlap) last_note(d, "reverse parameter");
    if (d->bcast_after && m->n_buffer_floats && d->world > 1)
        report_printf(&run->report, "ddp: --broadcast-buffers after-forward: rank 0's buffers are broadcast at the "
                                    "first gradient hook of each synchronising backward, overlapped with it (the "
                                    "values PyTorch's default broadcasts before the next forward)\n");
    else if (d->bcast_after) /* given, with nothing to move: said, as --sync-bn says it */
        report_printf(&run->report, "ddp: note: --broadcast-buffers after-forward changes nothing here: %s\n",
                      !m->n_buffer_floats ? "the model has no buffers (--norm none)"
                                          : "one rank has no one to broadcast to");
    if (d->find_unused)
        report_printf(&run->report, "ddp: find_unused_parameters: every synchronised backward first searches the "
                                    "layers from the output for parameters the forward did not use and marks them "
                                    "ready; a used-parameter map is all-reduced after the last bucket; the buckets "
                                    "are never rebuilt\n");
    if (c->accum_steps > 1) /* K = 1 (stage 5's default): every micro-step is a step, nothing to skip */
        report_printf(&run->report, "ddp: %s\n",
                      f->sync_each_micro_step
                          ? "--sync-each-micro-step: no no_sync — every micro-step all-reduces its gradients "
                            "(the experiment)"
                          : "no_sync for all but the last micro-step of each optimizer step: one all-reduce "
                            "per optimizer step");
    else if (f->sync_each_micro_step) /* a note, not an error: a sweep over K includes K = 1, as PyTorch allows */
        report_printf(&run->report, "ddp: note: --sync-each-micro-step changes nothing with --accum-steps 1 (every "
                                    "micro-step is an optimizer step, so no_sync has nothing to skip) — give "
                                    "--accum-steps K (K > 1) for the experiment\n");
}

void ddp_destroy(Ddp *d) {
    for (int s = 0; s <= DDP_STATS_LAG; s++)
        for (int i = 0; i < N_MARKS; i++) timemark_destroy(&d->steps[s].at[i]);
    for (int s = 0; s <= DDP_STATS_LAG; s++) free(d->steps[s].ops);
    DdpSeries *all[] = {&d->ar,          &d->exposed,     &d->bcast,     &d->ar_run,
                        &d->exposed_run, &d->bcast_run,   &d->search_ms, &d->fb_run};
    for (int i = 0; i < 8; i++) free(all[i]->v);
    free(d->buckets), free(d->bucket_of), free(d->ready_order), free(d->eval_idx);
    free(d->got), free(d->reached), free(d->reached_p), free(d->unused), free(d->used_back);
    if (d->used_pinned) host_free(d->dev, d->used_pinned, 1);
    if (d->used_dev) device_free(d->dev, d->used_dev);
    if (d->compressed) device_free(d->dev, d->compressed);
    if (d->fused_optim && d->overlap_optim == DDP_OPTIM_IN_BACKWARD) side_stream_destroy(&d->optim_stream);
}

void ddp_register_comm_hook(Ddp *d, Precision p) {
    if (p == PREC_FP32) return;
    ASSERT(!d->hook && d->iteration == 0);
    d->hook = p;
    d->compressed = device_alloc(d->dev, (size_t)d->m->n_param_floats * 2, "DDP 16-bit gradient all-reduce");
    report_printf(&d->run->report, "ddp: %s_compress_hook: each bucket is all-reduced in %s (half the bytes), then "
                                   "cast back to fp32\n", precision_name(p), precision_name(p));
}

void ddp_register_fused_optim(Ddp *d, Optimizer *opt, int grad_scaler) {
    if (d->overlap_optim == DDP_OPTIM_OFF) return; /* the caller steps after backward */
    ASSERT(!d->fused_optim && d->iteration == 0 && opt->count == d->m->n_param_floats);
    ASSERT(!grad_scaler); /* amp_check refuses --optimizer-overlap under the scaler or its statistics */
    d->fused_optim = opt;
    if (d->overlap_optim == DDP_OPTIM_IN_BACKWARD) {
        side_stream_init(&d->optim_stream, d->dev);
        model_set_hook_after_layer(d->m, 1); /* a conv's input gradient reads the weight the step overwrites */
    }
    report_printf(&d->run->report, "ddp: --optimizer-overlap %s: each bucket's parameters step as soon as its "
                                   "all-reduce is done, %s; no optimizer.step() after backward\n",
                  d->overlap_optim == DDP_OPTIM_IN_BACKWARD ? "in-backward (_register_fused_optim)" : "after-backward",
                  d->overlap_optim == DDP_OPTIM_IN_BACKWARD
                      ? "on a side stream while backward goes on"
                      : "after backward, on the compute stream, beside the last bucket's all-reduce");
}

/* The hook's casts: real 16-bit values on both backends (the CPU backend packs them, so the host
 * ring carries 2 bytes per element too). */
static void compress(Ddp *d, const float *g, int64_t n, void *dst) {
    if (d->dev->kind == DEV_CPU) precision_pack(d->hook, n, g, dst);
    else cast_to(d->dev, d->hook, n, g, dst);
}

static void decompress(Ddp *d, const void *src, int64_t n, float *g) {
    if (d->dev->kind == DEV_CPU) precision_unpack(d->hook, n, src, g);
    else cast_from(d->dev, d->hook, n, src, g);
}

void ddp_set_sync(Ddp *d, int sync) { d->sync = sync != 0; }

/* _pre_forward's buffer broadcast, if require_forward_param_sync says so; the flag then says
 * whether this forward's backward synchronises (_post_forward: grad enabled and not in no_sync). */
static int64_t forward_buffers(Ddp *d, DdpStep *s, int grad_sync) {
    int64_t op = -1;
    if (d->bcast_after) { /* the backward of a forward that sets the flag broadcasts instead (ddp.h) */
        d->bcast_owed = s && grad_sync && d->m->n_buffer_floats && d->world > 1;
        return -1;
    }
    if (d->forward_param_sync && d->m->n_buffer_floats && d->world > 1) {
        if (s) mark(d, s, T_PRE_BCAST);
        op = comm_broadcast_async(d->comm, d->m->buffer_flat, d->m->n_buffer_floats, 0);
        comm_wait(d->comm); /* the caller's next mark (T_FWD_BEGIN) ends the wait's span */
    }
    d->forward_param_sync = grad_sync;
    return op;
}

/* PyTorch's ensure_prior_reduction_finished, at the start of the next training forward: the first
 * moment the reducer can tell that a backward ended with a bucket never ready. Every rank got the
 * same gradients-or-none (the same model), so each rank stops here, before any collective: none is
 * left waiting in one. */
static void check_prior_reduction(Ddp *d) {
    if (!d->unfinished) return;
    const Model *m = d->m;
    char names[512] = "", idx[128] = "";
    size_t un = 0, ui = 0;
    int missing = 0;
    for (int p = 0; p < m->n_params; p++) {
        if (d->got[p]) continue;
        if (un < sizeof names)
            un += (size_t)snprintf(names + un, sizeof names - un, "%s%s", missing ? ", " : "", m->params[p].name);
        if (ui < sizeof idx) ui += (size_t)snprintf(idx + ui, sizeof idx - ui, "%s%d", missing ? ", " : "", p);
        missing++;
    }
    die_user("rank %d: the previous step's gradient reduction never finished: %s (parameter%s %s) got no gradient "
             "in its backward, so %s bucket was never all-reduced — the forward does not use %s: remove %s from "
             "the model%s or pass --find-unused-parameters (PyTorch: find_unused_parameters=True)",
             d->rank, names, missing == 1 ? "" : "s", idx, missing == 1 ? "its" : "their",
             missing == 1 ? "it" : "them", missing == 1 ? "it" : "them",
             m->unused_params ? " (here: drop --unused-param)" : "");
}

void ddp_forward_begin(Ddp *d) {
    launch_step(d->run->step + 1); /* where this rank is, for the launcher's failure report */
    check_prior_reduction(d);
    /* After the first synchronised backward, the buckets follow the order it produced gradients —
     * except under find_unused_parameters, where PyTorch never rebuilds them. */
    if (d->synced == 1 && !d->rebuilt && !d->find_unused) rebuild(d);
    if (d->iteration >= DDP_STATS_LAG) harvest(d, step_of(d, d->iteration - DDP_STATS_LAG));
    if (d->run->step + 1 != d->group_step) d->group_step = d->run->step + 1, d->opt_steps++;
    DdpStep *s = step_of(d, d->iteration);
    ASSERT(!s->pending);
    s->step = d->group_step;
    s->n_ops = 0, s->bytes = 0;
    s->synced = d->sync;
    s->bcast_op = forward_buffers(d, s, d->sync); /* after-forward: -1 now, set by the first hook */
    if (s->bcast_op >= 0) d->bcasts++;
    mark(d, s, T_FWD_BEGIN);
}

static void launch(Ddp *d, float *g, int64_t count) {
    DdpStep *s = step_of(d, d->iteration);
    TraceSpan span = trace_begin("bucket launch", "launch", s->n_ops); /* args.n: bucket, in launch order */
    /* Averaging, PyTorch's way: each rank's gradients times 1/world, then SUM — inside the
     * all-reduce (ncclAvg), not as a pass of its own on the compute stream. */
    int64_t id, bytes = count * (int64_t)sizeof(float);
    if (d->hook == PREC_FP32) {
        id = comm_allreduce_mean_async(d->comm, g, count, COMM_F32);
    } else { /* the compression hook: the same slice of the 16-bit copy, divided after the cast, as
              * fp16_compress_hook does */
        void *g16 = (char *)d->compressed + (g - d->m->grad_flat) * 2;
        compress(d, g, count, g16);
        id = comm_allreduce_mean_async(d->comm, g16, count, d->hook == PREC_FP16 ? COMM_F16 : COMM_BF16);
        bytes = count * 2;
    }
    trace_end(span);
    ASSERT(s->n_ops < d->m->n_params + 2); /* at most a bucket per parameter, and the used map */
    s->ops[s->n_ops++] = id;
    s->bytes += bytes;
    d->allreduce_calls++;
    d->allreduce_bytes += bytes;
}

/* PyTorch's search_unused_parameters: from the outputs, walk the autograd graph; a parameter whose
 * gradient node is not reached gets no gradient. Our graph is the layer list: walking it backwards
 * from the logits, a layer is reached when its output is, and then so are its inputs and parameters.
 * PyTorch walks every step, because the graph may differ from one forward to the next; so do we. */
static int search_unused(Ddp *d) {
    const Model *m = d->m;
    memset(d->reached, 0, (size_t)m->n_acts);
    memset(d->reached_p, 0, (size_t)m->n_params);
    d->reached[m->n_acts - 1] = 1;
    for (int l = m->n_layers - 1; l >= 0; l--) {
        const Layer *L = &m->layers[l];
        if (!d->reached[L->out]) continue;
        d->reached[L->in] = 1;
        if (L->in2 >= 0) d->reached[L->in2] = 1;
        if (L->p0 >= 0) d->reached_p[L->p0] = 1;
        if (L->p1 >= 0) d->reached_p[L->p1] = 1;
    }
    int n = 0;
    for (int p = 0; p < m->n_params; p++)
        if (!d->reached_p[p]) d->unused[n++] = p;
    return n;
}

/* --optimizer-overlap: bucket b's slice of the optimizer step, on the current stream, once that
 * bucket's all-reduce (communication op `op`) is done — the 16-bit hook's bucket cast back first. */
static void step_bucket(Ddp *d, const DdpBucket *b, int64_t op) {
    Model *m = d->m;
    comm_wait_op(d->comm, op); /* the current stream waits (the host ring: the host) */
    if (d->hook != PREC_FP32) decompress(d, (char *)d->compressed + b->offset * 2, b->count, m->grad_flat + b->offset);
    optim_step_slice(d->fused_optim, m->param_flat, m->grad_flat, run_lr(d->run), b->offset, b->count);
}

/* in-backward: on the side stream, at once. Waiting for this bucket's all-reduce, the side stream
 * also follows the compute stream up to its launch: every gradient of the bucket, and every read of
 * its weights (the hooks come after each layer's whole backward), is done. */
static void step_in_backward(Ddp *d, const DdpBucket *b) {
    DdpStep *s = step_of(d, d->iteration);
    side_stream_enter(&d->optim_stream);
    step_bucket(d, b, s->ops[s->n_ops - 1]); /* the all-reduce just launched */
    side_stream_leave(&d->optim_stream);
}

static void param_ready(Ddp *d, int p) {
    ASSERT(!d->got[p]); /* one gradient per parameter per backward */
    d->got[p] = 1, d->n_got++;
    if (d->synced == 0) d->ready_order[d->n_ready++] = p;
    if (!d->overlap) return;
    DdpBucket *b = &d->buckets[d->bucket_of[p]];
    ASSERT(b->pending > 0);
    if (--b->pending > 0) return;
    /* Launch every bucket that is complete, in index order: a bucket that completes early waits for
     * the ones before it, so all ranks issue the same collectives in the same order. */
    while (d->next < d->n_buckets && d->buckets[d->next].pending == 0) {
        DdpBucket *nb = &d->buckets[d->next++];
        launch(d, d->m->grad_flat + nb->offset, nb->count);
        if (d->fused_optim && d->overlap_optim == DDP_OPTIM_IN_BACKWARD) step_in_backward(d, nb);
    }
}

/* This micro-step's local used map. Its copy to the device runs on the compute stream after the host
 * has moved on; DDP_STATS_LAG + 1 micro-steps later, when the slot comes round again, reading that
 * step's timings back has waited for it. */
static float *used_host(Ddp *d) {
    return d->used_pinned + (d->iteration % (DDP_STATS_LAG + 1)) * (int64_t)d->m->n_params;
}

/* find_unused_parameters: the search (timed: it is on the step's critical path), then the parameters
 * it did not reach are marked ready — their gradients stay the zeros model_zero_grad left, and are
 * all-reduced with their bucket. PyTorch searches when the forward returns and marks them at the
 * first gradient hook; our stages make no call between the two, so both happen here. */
static void mark_unused(Ddp *d) {
    TraceSpan span = trace_begin("find unused parameters", "ddp", d->iteration);
    double t0 = time_now();
    d->n_unused = search_unused(d);
    double ms = 1e3 * (time_now() - t0);
    trace_end(span);
    if (d->searches++ >= WARMUP_STEPS) series_push(&d->search_ms, ms);
    int64_t floats = 0;
    for (int i = 0; i < d->n_unused; i++) floats += d->m->params[d->unused[i]].count;
    d->unused_bytes = floats * (d->hook == PREC_FP32 ? 4 : 2);
    if (d->searches == 1) {
        char names[256] = "";
        size_t used = 0;
        for (int i = 0; i < d->n_unused && used < sizeof names; i++)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                                     d->m->params[d->unused[i]].name);
        if (d->n_unused)
            report_printf(&d->run->report, "ddp: the forward does not use %d parameter%s (%s): marked ready every "
                                           "step, their zero gradients all-reduced\n",
                          d->n_unused, d->n_unused == 1 ? "" : "s", names);
        else
            report_printf(&d->run->report, "ddp: warning: --find-unused-parameters found no unused parameter; the "
                                           "search runs every step for nothing — drop the flag\n");
    }
    for (int i = 0; i < d->n_unused; i++) param_ready(d, d->unused[i]);
}

void ddp_grad_ready(void *ctx, int p) {
    Ddp *d = ctx;
    /* no_sync: the gradient just stays in (is added to) the flat buffer */
    if (!d->sync) return;
    if (d->bcast_owed) { /* --broadcast-buffers after-forward: ahead of every bucket, overlapped */
        DdpStep *s = step_of(d, d->iteration);
        d->bcast_owed = 0;
        s->bcast_op = comm_broadcast_async(d->comm, d->m->buffer_flat, d->m->n_buffer_floats, 0);
        d->bcasts++;
    }
    if (d->find_unused) {
        if (d->n_got == 0) { /* the first hook of this backward */
            memset(used_host(d), 0, (size_t)d->m->n_params * sizeof(float));
            mark_unused(d);
        }
        used_host(d)[p] = 1; /* PyTorch's local_used_map: this rank used p */
    }
    param_ready(d, p);
}

/* PyTorch's all_reduce_local_used_map: which parameters any rank used, issued after the last bucket.
 * Read back (a wait and a copy on the step's path) only when this rank left one unused — PyTorch
 * then needs to know whether another rank used it, and leaves the gradient of one no rank used
 * untouched. Here every rank runs the same layers, so the answer is always "no rank": it is counted
 * for the cost, and checked. */
static void used_map_allreduce(Ddp *d, DdpStep *s) {
    const Model *m = d->m;
    device_copy_h2d(d->dev, d->used_dev, used_host(d), (size_t)m->n_params * sizeof(float));
    int64_t id = comm_allreduce_async(d->comm, d->used_dev, m->n_params);
    ASSERT(s->n_ops < d->m->n_params + 2);
    s->ops[s->n_ops++] = id; /* its time is communication of this step */
    d->used_map_calls++;
}

static void used_map_check(Ddp *d) {
    const Model *m = d->m;
    if (d->n_unused == 0) return;
    device_copy_d2h(d->dev, d->used_back, d->used_dev, (size_t)m->n_params * sizeof(float));
    d->used_map_readbacks++;
    for (int i = 0; i < d->n_unused; i++) ASSERT(d->used_back[d->unused[i]] == 0.0f); /* unused on every rank */
}

void ddp_backward_end(Ddp *d) {
    DdpStep *s = step_of(d, d->iteration);
    Model *m = d->m;
    s->pending = 1;
    mark(d, s, T_BWD_END);
    if (!s->synced) { /* no_sync: nothing was launched, nothing to wait for */
        d->iteration++;
        return;
    }
    /* A parameter without a gradient (ddp.h): its bucket, and every later one, was never launched —
     * with --no-overlap, the one piece. Nothing fails here, as nothing does in PyTorch: the launched
     * buckets are waited for, the optimizer steps on the rest unaveraged, the next forward stops. */
    d->unfinished = d->n_got < m->n_params;
    if (!d->overlap && !d->unfinished) launch(d, m->grad_flat, m->n_param_floats);
    if (d->find_unused && !d->unfinished) used_map_allreduce(d, s);
    /* after-backward: the buckets in order, each once its own all-reduce is done (bucket b's is
     * ops[b]: they launch in index order) — all but the last beside the last all-reduce; the
     * wait for it, not their steps, is the exposed communication */
    int after = steps_after_backward(d), last = d->next - 1;
    for (int b = 0; after && b < last; b++) step_bucket(d, &d->buckets[b], s->ops[b]);
    if (after) mark(d, s, T_WAIT_BEGIN);
    /* The optimizer must see the averaged gradients: the compute stream waits for every bucket. */
    comm_wait(d->comm);
    mark(d, s, T_AFTER_WAIT);
    if (d->fused_optim) { /* …and for every bucket's step: then the optimizer step is done */
        if (after && last >= 0) step_bucket(d, &d->buckets[last], s->ops[last]);
        if (d->overlap_optim == DDP_OPTIM_IN_BACKWARD) side_stream_join(&d->optim_stream);
        if (d->next) optim_slices_done(d->fused_optim); /* every launched bucket was stepped */
    }
    if (d->find_unused && !d->unfinished) used_map_check(d);
    /* the hook's buckets tile the buffer: one cast brings every reduced bucket back to fp32 (only
     * the launched ones, when some never were; with --optimizer-overlap, each was cast back
     * before its step) */
    if (d->hook != PREC_FP32 && !d->fused_optim) {
        if (!d->unfinished) decompress(d, d->compressed, m->n_param_floats, m->grad_flat);
        else
            for (int b = 0; d->overlap && b < d->next; b++)
                decompress(d, (char *)d->compressed + d->buckets[b].offset * 2, d->buckets[b].count,
                           m->grad_flat + d->buckets[b].offset);
    }
    for (int b = 0; b < d->n_buckets; b++) d->buckets[b].pending = d->buckets[b].n_params;
    d->next = 0;
    if (!d->unfinished) { /* got[] is kept when unfinished: the next forward names the missing ones */
        memset(d->got, 0, (size_t)m->n_params);
        d->n_got = 0;
        if (d->synced == 0) ASSERT(d->n_ready == m->n_params);
        d->synced++;
    }
    d->iteration++;
}

void ddp_evaluate(Ddp *d, InputPipe *in, int64_t n_test, StepLog *scratch, double *accuracy,
                  double *loss) {
    launch_mark_epoch_end(); /* a failure from here is not the last step's (the launcher's report) */
    /* model.eval(); with torch.no_grad(): the first forward broadcasts (if a synchronised step came
     * before, or no step yet: the flag starts set), and a forward without gradients leaves
     * require_forward_param_sync off. */
    if (forward_buffers(d, NULL, 0) >= 0) d->eval_bcasts++;
    /* DistributedSampler(test_set, shuffle=False): positions rank, rank + R, …; those past the end
     * of the test set are padding (repeats), always this rank's last ones: not evaluated. */
    if (!d->eval_idx || d->eval_n != n_test) {
        free(d->eval_idx);
        d->eval_idx = xmalloc((size_t)(sampler_num_samples(n_test, d->world, 0) + 1) * sizeof(int64_t));
        sampler_indices(n_test, d->world, d->rank, 0, 0, 0, 0, d->eval_idx);
        d->eval_n = n_test;
    }
    double sums[3]; /* Σ loss, correct, samples */
    evaluate_indices(d->m, in, scratch, d->eval_idx, sampler_num_real(n_test, d->world, d->rank), sums);
    comm_sum_doubles(d->comm, sums, 3);
    *loss = sums[2] > 0 ? sums[0] / sums[2] : NAN;
    *accuracy = sums[2] > 0 ? sums[1] / sums[2] : NAN;
}

/* Each rank's own medians, side by side: how long its forward + backward took on its compute stream,
 * and how long it then waited for the gradients and for the buffer broadcast. Ranks wait for each
 * other there, so the averages hide which one was late: a rank whose forward + backward is longer
 * waits less, and the step goes at its pace. Collective. */
static void per_rank(Ddp *d) {
    enum { FB, EX, BC, N };
    double v[N * DDP_PER_RANK_MAX] = {0};
    /* a series with no timed step is NAN (console "n/a", JSON null), not a median of 0 ms */
    const DdpSeries *series[N] = {&d->fb_run, &d->exposed_run, &d->bcast_run};
    for (int k = 0; k < N; k++) v[N * d->rank + k] = series[k]->n ? series_median(series[k]) : NAN;
    comm_sum_doubles(d->comm, v, N * d->world); /* NAN + the other ranks' 0s stays NAN */
    static const char *const what[N] = {"forward+backward", "waited after backward", "waited for buffers"};
    static const char *const key[N] = {"fwd_bwd_ms_per_rank", "exposed_backward_ms_per_rank", "bcast_ms_per_rank"};
    char line[4096]; /* 64 ranks × 3 values fit; appended piece by piece, never past the end */
    size_t used = (size_t)snprintf(line, sizeof line, "  per rank, ms (rank 0 … %d):", d->world - 1);
    Report *r = &d->run->report;
    for (int k = 0; k < N; k++) {
        if (used < sizeof line) used += (size_t)snprintf(line + used, sizeof line - used, "%s %s", k ? " |" : "", what[k]);
        for (int i = 0; i < d->world && used < sizeof line; i++)
            used += isnan(v[N * i + k]) ? (size_t)snprintf(line + used, sizeof line - used, " n/a")
                                        : (size_t)snprintf(line + used, sizeof line - used, " %.3f", v[N * i + k]);
    }
    if (d->world > 1) report_printf(r, "%s\n", line); /* one rank: the JSON only, a baseline for the others */
    json_begin(r, "comm_per_rank");
    for (int k = 0; k < N; k++) {
        double x[DDP_PER_RANK_MAX];
        for (int i = 0; i < d->world; i++) x[i] = v[N * i + k];
        json_num_list(r, key[k], x, d->world);
    }
    json_end(r);
}

/* Medians of this rank's series, averaged over ranks; the line and the JSON record. Collective. */
static void report(Ddp *d, const char *type, DdpSeries *ar, DdpSeries *ex, DdpSeries *bc) {
    Run *r = d->run;
    int accum = r->cfg->accum_steps > 0, summary = !strcmp(type, "comm_summary");
    double v[5] = {series_median(ar), series_median(ex), series_median(bc), ar->n > 0, series_median(&d->search_ms)};
    comm_sum_doubles(d->comm, v, 5);
    for (int i = 0; i < 3; i++) v[i] /= d->world;
    v[4] /= d->world;
    /* no optimizer step timed after warm-up (a short run): the times are NAN — JSON null, as in
     * comm_per_rank and the summary's ms_per_iter_median — never a 0 ms that reads as measured */
    if (v[3] == 0) v[0] = v[1] = v[2] = NAN;
    double step_ms = r->n_times ? stats_median_copy(r->times, r->n_times) : NAN;
    /* bytes all-reduced per optimizer step: the gradients once — K times without no_sync */
    int64_t grad_bytes = d->m->n_param_floats * (int64_t)sizeof(float);
    int64_t bytes = d->opt_steps ? d->allreduce_bytes / d->opt_steps : grad_bytes;
    double algbw = v[0] > 0 ? (double)bytes / (v[0] * 1e6) : isnan(v[0]) ? NAN : 0, exposed = v[1] + v[2];
    double pct = step_ms > 0 ? 100.0 * exposed / step_ms : NAN;
    if (v[3] > 0) {
        char mb[32], pieces[64], share[48] = "no step timed to compare"; /* a short run times comm, not a step */
        if (step_ms > 0) snprintf(share, sizeof share, "%.1f%% of the step", pct);
        fmt_bytes(mb, sizeof mb, (double)bytes);
        if (accum && bytes != grad_bytes)
            snprintf(pieces, sizeof pieces, "%.2f × the gradients", (double)bytes / (double)grad_bytes);
        else
            snprintf(pieces, sizeof pieces, "%d %s", d->overlap ? d->n_buckets : 1,
                     d->overlap ? (d->n_buckets == 1 ? "bucket" : "buckets") : "piece, after backward");
        /* GPUs move GB/s, the CPU backend's TCP ring on a tiny model hundredths of one: 3 decimals below 1,
         * never a "0.0 GB/s" that reads as broken */
        const double busbw = algbw * busbw_factor(d->world);
        report_printf(&r->report,
                      "%s all-reduce %.3f ms/%s (%s in %s, algbw %.*f GB/s, busbw %.*f GB/s) | exposed "
                      "%.3f ms = %s (after backward %.3f, buffer broadcast %.3f)\n",
                      summary ? "comm over the run:" : "  comm:", v[0], accum ? "optimizer step" : "step", mb,
                      pieces, algbw < 0.95 ? 3 : 1, algbw, busbw < 0.95 ? 3 : 1, busbw, exposed, share, v[1], v[2]);
    }
    if (summary && d->world <= DDP_PER_RANK_MAX) per_rank(d);
    int64_t sb_calls, sb_bytes;
    syncbn_counts(&sb_calls, &sb_bytes);
    if (summary && (accum || d->world > 1)) {
        char total[32], sb[160] = "";
        fmt_bytes(total, sizeof total, (double)d->allreduce_bytes);
        if (sb_calls) { /* --sync-bn: waited for inside forward and backward, so not in "exposed" above */
            char b[32];
            snprintf(sb, sizeof sb, " | %lld SyncBatchNorm exchanges (%s), waited for inside forward+backward",
                     (long long)sb_calls, fmt_bytes(b, sizeof b, (double)sb_bytes));
        }
        report_printf(&r->report,
                      "  counts: %lld optimizer step%s, %lld micro-step%s | %lld gradient all-reduce%s (%s) | %lld "
                      "buffer broadcast%s in training, %lld in evaluation%s\n",
                      (long long)d->opt_steps, d->opt_steps == 1 ? "" : "s", (long long)d->iteration,
                      d->iteration == 1 ? "" : "s", (long long)d->allreduce_calls, d->allreduce_calls == 1 ? "" : "s",
                      total, (long long)d->bcasts, d->bcasts == 1 ? "" : "s", (long long)d->eval_bcasts, sb);
    }
    if (summary && d->find_unused) { /* what find_unused_parameters cost */
        char zeros[32], map[32], search[48] = "n/a (no step after warm-up)";
        fmt_bytes(zeros, sizeof zeros, (double)d->unused_bytes);
        fmt_bytes(map, sizeof map, (double)d->m->n_params * sizeof(float));
        if (d->search_ms.n) snprintf(search, sizeof search, "%.1f µs/step", 1e3 * v[4]);
        report_printf(&r->report,
                      "  find_unused_parameters: search %s | %d unused parameter%s (%s of zeros in every step's "
                      "all-reduce) | %lld used-parameter map all-reduce%s (%s each), %lld read back | buckets "
                      "never rebuilt\n",
                      search, d->n_unused, d->n_unused == 1 ? "" : "s", zeros, (long long)d->used_map_calls,
                      d->used_map_calls == 1 ? "" : "s", map, (long long)d->used_map_readbacks);
    }
    json_begin(&r->report, type);
    json_int(&r->report, "epoch", r->epoch_reported); /* the epoch record's number (a partial one too) */
    json_int(&r->report, "step", r->step);
    json_str(&r->report, "comm", comm_describe(d->comm));
    json_int(&r->report, "overlap", d->overlap);
    json_int(&r->report, "buckets", d->overlap ? d->n_buckets : 1);
    json_int(&r->report, "bytes_per_step", bytes);
    json_num(&r->report, "allreduce_ms_median", v[0]);
    json_num(&r->report, "exposed_ms_median", exposed);
    json_num(&r->report, "exposed_backward_ms_median", v[1]);
    json_num(&r->report, "bcast_ms_median", v[2]);
    json_num(&r->report, "step_ms_median", step_ms);
    json_num(&r->report, "exposed_pct", pct);
    json_num(&r->report, "algbw_gbps", algbw);
    json_num(&r->report, "busbw_gbps", algbw * busbw_factor(d->world));
    json_int(&r->report, "micro_steps", d->iteration);
    json_int(&r->report, "optimizer_steps", d->opt_steps);
    json_int(&r->report, "allreduce_calls", d->allreduce_calls);
    json_int(&r->report, "allreduce_bytes", d->allreduce_bytes);
    json_int(&r->report, "buffer_broadcasts", d->bcasts);
    json_int(&r->report, "eval_buffer_broadcasts", d->eval_bcasts);
    json_int(&r->report, "syncbn_exchanges", sb_calls);
    json_int(&r->report, "syncbn_bytes", sb_bytes);
    json_int(&r->report, "find_unused_parameters", d->find_unused);
    if (d->find_unused) {
        json_num(&r->report, "unused_search_ms_median", v[4]);
        json_int(&r->report, "unused_params", d->n_unused);
        json_int(&r->report, "unused_bytes_per_step", d->unused_bytes);
        json_int(&r->report, "used_map_allreduces", d->used_map_calls);
        json_int(&r->report, "used_map_readbacks", d->used_map_readbacks);
    }
    if (summary) {
        int64_t sizes[64];
        int n = d->n_buckets < 64 ? d->n_buckets : 64;
        for (int b = 0; b < n; b++) sizes[b] = d->buckets[b].count * (int64_t)sizeof(float);
        json_int_list(&r->report, "bucket_bytes", sizes, n);
        /* …and the run's summary record carries the counts too */
        run_summary_int(r, "micro_steps", d->iteration);
        run_summary_int(r, "optimizer_steps", d->opt_steps);
        run_summary_int(r, "allreduce_calls", d->allreduce_calls);
        run_summary_int(r, "allreduce_bytes", d->allreduce_bytes);
        run_summary_int(r, "buffer_broadcasts", d->bcasts);
        run_summary_int(r, "eval_buffer_broadcasts", d->eval_bcasts);
        run_summary_num(r, "exposed_comm_ms_per_step", exposed);
        if (d->find_unused) {
            run_summary_num(r, "unused_search_ms_per_step", v[4]);
            run_summary_int(r, "unused_bytes_per_step", d->unused_bytes);
            run_summary_int(r, "used_map_allreduces", d->used_map_calls);
        }
    }
    json_end(&r->report);
}

void ddp_epoch_end(Ddp *d) {
    harvest_all(d);
    report(d, "comm_epoch", &d->ar, &d->exposed, &d->bcast);
    d->ar.n = d->exposed.n = d->bcast.n = 0;
}

void ddp_finish(Ddp *d) {
    if (d->unfinished) /* no next forward to stop at: PyTorch would say nothing */
        fprintf(stderr, "rank %d: warning: the last step's gradients were never all-reduced (a parameter got no "
                        "gradient); the next forward would have stopped — see --find-unused-parameters\n", d->rank);
    harvest_all(d);
    if (!d->run->evaluated) /* --evaluate: no step to sum up */
        report(d, "comm_summary", &d->ar_run, &d->exposed_run, &d->bcast_run);
}
