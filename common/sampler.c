/* sampler.c — DistributedSampler's index arithmetic (see sampler.h). */
#include "sampler.h"

#include <stdlib.h>

#include "errors.h"
#include "rng.h"

int64_t sampler_num_samples(int64_t n, int world, int drop_last) {
    if (drop_last && n % world != 0) return (n - world + world - 1) / world; /* ceil((N−R)/R) */
    return (n + world - 1) / world;
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
