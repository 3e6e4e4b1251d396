/* test_rng.c — mt19937 against the C++ standard's reference values; randperm and the sampler's
 * structural properties (PyTorch's exact values are checked in test_fixtures.c). */
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "sampler.h"
#include "tests.h"

START_TEST(mt19937_matches_std) {
    /* std::mt19937 default-seeded with 5489: first output 3499211612, 10000th 4123659995. */
    Mt19937 g;
    mt_seed(&g, 5489);
    ck_assert_uint_eq(mt_next(&g), 3499211612u);
    for (int i = 2; i < 10000; i++) mt_next(&g);
    ck_assert_uint_eq(mt_next(&g), 4123659995u);
}
END_TEST

/* The other generators, pinned to outside values: torch.rand's float takes the LOW 24 bits of a
 * 32-bit draw (ATen's uniform_real_distribution), and splitmix64 from state 0 gives the reference
 * implementation's first output. Every synthetic image, augmentation and sampler key comes from
 * these, so a change here would silently change what every run trains on. */
START_TEST(uniform_and_splitmix_pinned) {
    Mt19937 g;
    mt_seed(&g, 5489);
    ck_assert(mt_uniform(&g) == (double)(3499211612u & 0xffffffu) / 16777216.0); /* 0.56926512718… */
    ck_assert_uint_eq(splitmix64(0), 0xe220a8397b1dcdafull);
    ck_assert_uint_eq(splitmix64(1), 0x910a2dec89025cc1ull);
}
END_TEST

START_TEST(randperm_is_permutation) {
    int64_t n = 1000, out[1000];
    char seen[1000] = {0};
    randperm(n, 3, out);
    for (int64_t i = 0; i < n; i++) {
        ck_assert(out[i] >= 0 && out[i] < n);
        ck_assert(!seen[out[i]]);
        seen[out[i]] = 1;
    }
    int64_t again[1000], other[1000];
    randperm(n, 3, again);
    randperm(n, 4, other);
    ck_assert(!memcmp(out, again, sizeof out));
    ck_assert(memcmp(out, other, sizeof out));
}
END_TEST

/* ATen's randperm_cpu switches to the inside-out shuffle with random64() (first draw high) from
 * n = UINT32_MAX / 20 on; the values come from that code transcribed on its own. A set that large
 * takes 1.7 GB, so the branch is pinned at small n and the switch point as a number. */
START_TEST(randperm_large_n_branch_is_atens) {
    ck_assert_int_eq(RANDPERM_SWAP_MAX_N, 214748364);
    static const int64_t want0[8] = {7, 2, 6, 3, 5, 1, 0, 4}, want42[8] = {6, 0, 5, 4, 7, 2, 3, 1};
    int64_t got[8];
    randperm_inside_out(8, 0, got);
    for (int i = 0; i < 8; i++) ck_assert_int_eq(got[i], want0[i]);
    randperm_inside_out(8, 42, got);
    for (int i = 0; i < 8; i++) ck_assert_int_eq(got[i], want42[i]);
}
END_TEST

START_TEST(sampler_partitions_padded_list) {
    /* For N = 10, R = 4: 3 per rank, 12 in total = the permutation plus its first 2 again. */
    int64_t perm[10], got[4][3];
    randperm(10, 5 + 2, perm);
    ck_assert_int_eq(sampler_num_samples(10, 4, 0), 3);
    ck_assert_int_eq(sampler_num_samples(10, 4, 1), 2);
    ck_assert_int_eq(sampler_num_samples(3, 4, 1), 0);
    ck_assert_int_eq(sampler_num_samples(3, 4, 0), 1);
    for (int r = 0; r < 4; r++) sampler_indices(10, 4, r, 5, 2, 1, 0, got[r]);
    for (int k = 0; k < 12; k++) ck_assert_int_eq(got[k % 4][k / 4], perm[k % 10]);
    int64_t one[10];
    sampler_indices(10, 1, 0, 5, 2, 1, 0, one); /* R = 1 is the plain epoch order */
    ck_assert(!memcmp(one, perm, sizeof perm));
    sampler_indices(10, 1, 0, 5, 2, 0, 0, one);
    for (int i = 0; i < 10; i++) ck_assert_int_eq(one[i], i);
}
END_TEST

/* Sharded evaluation counts each rank's real samples (sampler_num_real), not its padding: for every
 * N and R, rank r's first num_real indices are exactly its positions below N of the padded list, and
 * the counts add up to N — each test sample once. For N = 10, R = 4: 3, 3, 2, 2. */
START_TEST(sampler_num_real_counts_each_sample_once) {
    ck_assert_int_eq(sampler_num_real(10, 4, 0), 3);
    ck_assert_int_eq(sampler_num_real(10, 4, 1), 3);
    ck_assert_int_eq(sampler_num_real(10, 4, 2), 2);
    ck_assert_int_eq(sampler_num_real(10, 4, 3), 2);
    ck_assert_int_eq(sampler_num_real(3, 4, 3), 0); /* N < R: the last rank holds only padding */
    int64_t idx[16];
    for (int64_t n = 1; n <= 13; n++)
        for (int world = 1; world <= 5; world++) {
            int64_t total = 0, per_rank = sampler_num_samples(n, world, 0);
            int seen[13] = {0};
            for (int r = 0; r < world; r++) {
                int64_t real = sampler_num_real(n, world, r);
                ck_assert_msg(real >= 0 && real <= per_rank, "N %lld, R %d, rank %d: %lld real of %lld",
                              (long long)n, world, r, (long long)real, (long long)per_rank);
                for (int64_t k = 0; k < per_rank; k++) /* position r + kR of the padded list is real below N */
                    ck_assert_msg((k < real) == (r + k * world < n), "N %lld, R %d, rank %d: index %lld %s",
                                  (long long)n, world, r, (long long)k, k < real ? "is padding" : "is real");
                sampler_indices(n, world, r, 5, 0, 1, 0, idx);
                for (int64_t k = 0; k < real; k++) seen[idx[k]]++;
                total += real;
            }
            ck_assert_int_eq(total, n);
            for (int64_t i = 0; i < n; i++) ck_assert_msg(seen[i] == 1, "N %lld, R %d: sample %lld evaluated %d times",
                                                          (long long)n, world, (long long)i, seen[i]);
        }
}
END_TEST

Suite *suite_rng(void) {
    Suite *s = suite_create("rng");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, mt19937_matches_std);
    tcase_add_test(tc, uniform_and_splitmix_pinned);
    tcase_add_test(tc, randperm_is_permutation);
    tcase_add_test(tc, randperm_large_n_branch_is_atens);
    tcase_add_test(tc, sampler_partitions_padded_list);
    tcase_add_test(tc, sampler_num_real_counts_each_sample_once);
    suite_add_tcase(s, tc);
    return s;
}
