/* sampler.c — DistributedSampler's index arithmetic (see sampler.h). */
#include "sampler.h"

#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "errors.h"
#include "rng.h"

int64_t sampler_num_samples(int64_t n, int world, int drop_last) {
    if (drop_last && n % world != 0) return (n - world + world - 1) / world; /* ceil((N−R)/R) */
    return (n + world - 1) / world;
}

int64_t sampler_shard_size(int64_t n, int world, int drop_last) {
    int64_t shard = sampler_num_samples(n, world, drop_last);
    /* Three fixes, as the set allows: --train-size grows only the synthetic set (--data's files hold what
     * they hold, and asking them for more is refused), so fewer ranks is named too. */
    if (shard < 1)
        die_user("--drop-last with %lld training samples and %d ranks leaves no sample per rank — drop --drop-last, "
                 "run at most %lld rank%s, or train on %d samples or more (--train-size %d with the synthetic set)",
                 (long long)n, world, (long long)n, n == 1 ? "" : "s", world, world);
    return shard;
}

void sampler_indices(int64_t n, int world, int rank, uint64_t seed, int64_t epoch, int shuffle,
                     int drop_last, int64_t *out) {
    ASSERT(world >= 1 && rank >= 0 && rank < world);
    int64_t per_rank = sampler_num_samples(n, world, drop_last);
    int64_t *order = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (shuffle) randperm(n, seed + (uint64_t)epoch, order);
    else
        for (int64_t i = 0; i < n; i++) order[i] = i;
    /* Position i of the padded (or truncated) list is order[i mod N]: padding repeats the list
     * from its start, as many times as needed when N < R. Rank r takes positions r, r+R, … */
    for (int64_t k = 0; k < per_rank; k++) out[k] = order[(rank + k * world) % n];
    free(order);
}

int64_t sampler_num_real(int64_t n, int world, int rank) {
    ASSERT(world >= 1 && rank >= 0 && rank < world);
    /* rank r's k-th index sits at position r + kR of the padded list: real while r + kR < N */
    return n > rank ? (n - rank + world - 1) / world : 0;
}

int sampler_show(const SamplerShow *s, uint64_t seed, int shuffle, int drop_last) {
    static const char *const uses[] = {"show-sampler", "dataset-size", "world-size", "rank", "epoch", "seed",
                                       "no-shuffle", "drop-last", NULL};
    cli_lesson_flags("show-sampler", "one rank's sample indices", uses);
    if (s->dataset_size < 1) die_user("--show-sampler needs --dataset-size N (the length of the dataset)");
    if (s->rank >= s->world_size)
        die_user("--rank %d must be below --world-size %d (ranks are numbered from 0)", s->rank, s->world_size);
    int64_t n = sampler_num_samples(s->dataset_size, s->world_size, drop_last);
    /* The whole permutation is built, as DistributedSampler's torch.randperm(N) builds it: 8 bytes a
     * sample. Past the free memory malloc still succeeds (Linux overcommits) and the kernel kills the
     * process as the pages fill — so refuse it here, with the figures. */
    double need = 8.0 * (double)s->dataset_size + 8.0 * (double)(n + 1), have = host_mem_available();
    if (need > have)
        die_user("--show-sampler --dataset-size %lld needs %.1f GiB of host memory (the permutation of all N "
                 "samples, 8 bytes each, as torch.randperm(N) holds it) and %.1f GiB is available — give a "
                 "smaller --dataset-size", (long long)s->dataset_size, need / 1073741824.0, have / 1073741824.0);
    int64_t *idx = xmalloc((size_t)(n + 1) * sizeof(int64_t));
    sampler_indices(s->dataset_size, s->world_size, s->rank, seed, s->epoch, shuffle, drop_last, idx);
    for (int64_t i = 0; i < n; i++) printf(i ? " %lld" : "%lld", (long long)idx[i]);
    printf("\n");
    free(idx);
    return 0;
}
