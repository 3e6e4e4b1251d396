/* sampler.h — torch.utils.data.DistributedSampler, exactly (see SEMANTICS.md).
 *
 * Every rank computes the same epoch order — randperm(N) seeded with seed + epoch, or 0..N−1 —
 * pads it by repeating from its start (or truncates it with drop_last) to a multiple of the world
 * size R, and takes every R-th index starting at its rank. No communication is needed: identical
 * inputs give identical orders. With R = 1 this is exactly stage 1's epoch order. */
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stdint.h>

/* Indices per rank: ceil((N − R) / R) with drop_last when N % R ≠ 0, else ceil(N / R). */
int64_t sampler_num_samples(int64_t n, int world, int drop_last);
/* Rank `rank`'s indices for `epoch` into out[0 .. sampler_num_samples − 1]. */
void sampler_indices(int64_t n, int world, int rank, uint64_t seed, int64_t epoch, int shuffle,
                     int drop_last, int64_t *out);

#endif
