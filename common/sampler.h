/* sampler.h — torch.utils.data.DistributedSampler, exactly.
 *
 * Every rank computes the same epoch order — randperm(N) seeded with seed + epoch, or 0..N−1 —
 * pads it by repeating from its start (or truncates it with drop_last) to a multiple of the world
 * size R, and takes every R-th index starting at its rank. No communication is needed: identical
 * inputs give identical orders. With R = 1 this is exactly stage 1's epoch order.
 *
 * The padding makes every rank's shard the same length (so every rank runs the same number of
 * steps, and of collectives). For evaluation that padding must not be counted twice: a rank's
 * indices at positions ≥ N of the padded list are repeats, and they are always its last ones
 * (sampler_num_real). */
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stdint.h>

/* Indices per rank: ceil((N − R) / R) with drop_last when N % R ≠ 0, else ceil(N / R). */
int64_t sampler_num_samples(int64_t n, int world, int drop_last);
/* sampler_num_samples for a training set, refused with a clear error (naming the fixes: no --drop-last,
 * fewer ranks, or a larger synthetic set) when --drop-last leaves a rank no sample at all. */
int64_t sampler_shard_size(int64_t n, int world, int drop_last);
/* Rank `rank`'s indices for `epoch` into out[0 .. sampler_num_samples − 1]. */
void sampler_indices(int64_t n, int world, int rank, uint64_t seed, int64_t epoch, int shuffle,
                     int drop_last, int64_t *out);
/* How many of rank `rank`'s indices (without drop_last) are real samples, not padding: the first
 * ceil((N − rank) / R) of them. Summed over the ranks: exactly N. */
int64_t sampler_num_real(int64_t n, int world, int rank);

/* --show-sampler: the lesson's window on the sampler (set by ddp_options' rows). */
typedef struct SamplerShow {
    int show;             /* --show-sampler given */
    int world_size, rank; /* --world-size, --rank */
    int64_t dataset_size; /* --dataset-size (−1: not given) */
    int64_t epoch;        /* --epoch */
} SamplerShow;
/* Print rank s->rank's indices for s->epoch on one line; a missing or inconsistent flag is a user
 * error. Returns the exit status (0). */
int sampler_show(const SamplerShow *s, uint64_t seed, int shuffle, int drop_last);

#endif
