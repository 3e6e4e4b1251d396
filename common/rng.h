/* rng.h — the random numbers the trainer uses, chosen to match PyTorch where it matters.
 *
 * mt19937 is PyTorch's CPU generator: torch.Generator().manual_seed(s) seeds it with the standard
 * init_genrand on (uint32)s, and randperm draws its 32-bit outputs (docs/semantics.md). So the
 * epoch order and stage 3's DistributedSampler are bit-identical to PyTorch's.
 * splitmix64 hashes (seed, epoch, index) into the random choices of one sample's augmentation, so
 * they do not depend on which worker thread or rank handles the sample. */
#ifndef RNG_H
#define RNG_H

#include <stdint.h>

typedef struct Mt19937 {
    uint32_t mt[624];
    int idx;
} Mt19937;

void mt_seed(Mt19937 *g, uint64_t seed); /* PyTorch: manual_seed(seed) */
uint32_t mt_next(Mt19937 *g);            /* PyTorch: generator->random() */
double mt_uniform(Mt19937 *g);           /* [0, 1) with 24 random bits, like torch.rand for float */
double mt_normal(Mt19937 *g);            /* standard normal (Box–Muller) */

/* PyTorch's CPU randperm(n, generator seeded with `seed`), written into out[0..n-1]. Like ATen's
 * randperm_cpu it has two algorithms: swaps drawn with 32-bit outputs below RANDPERM_SWAP_MAX_N
 * (almost every dataset), the inside-out shuffle with 64-bit draws from there on. */
#define RANDPERM_SWAP_MAX_N ((int64_t)(UINT32_MAX / 20)) /* 214748364: ATen's n < uint32 max / 20 */
void randperm(int64_t n, uint64_t seed, int64_t *out);
/* ATen's large-n branch on its own (randperm takes it from RANDPERM_SWAP_MAX_N on), for any n. */
void randperm_inside_out(int64_t n, uint64_t seed, int64_t *out);

uint64_t splitmix64(uint64_t x);
/* A 64-bit hash of three keys, e.g. (seed, epoch, sample index). */
uint64_t hash3(uint64_t a, uint64_t b, uint64_t c);

#endif
