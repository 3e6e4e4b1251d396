/* peak.h — the hardware's ceilings: a GPU's dense tensor-core FLOP/s and its memory bandwidth.
 *
 * "How fast is it?" needs "out of what?". The trainer divides the model's FLOPs per step
 * (model_flops) by the step time and prints that as a fraction of the GPU's peak for the math the
 * convolutions run in; tests/bench_kernels.cu divides the bytes each kernel must move by its time
 * and prints that as a fraction of the peak memory bandwidth. Both peaks are the datasheet kind:
 * ceilings no real program reaches (cuBLAS's best large GEMMs get to ~70–80% of the FLOP/s; a
 * streaming copy ~90% of the bandwidth), which is exactly why they are the honest denominator.
 *
 * Peak FLOP/s, in order of preference:
 *  1. PEAK_TFLOPS in the environment (TFLOP/s of ONE device for the run's math), for a GPU the
 *     table does not know, a clock you have locked, or to state the CPU's;
 *  2. NVIDIA's datasheet for the parts we measure on (dense, i.e. without 2:4 sparsity):
 *       H100 SXM / H200 SXM / GH200 (sm_90, 132 SMs)  TF32 494.7, FP16 / BF16 989.4, FP32 66.9
 *       A100 (sm_80, 108 SMs)                         TF32 156,   FP16 / BF16 312,   FP32 19.5
 *  3. otherwise an estimate: SMs × (dense FLOP per clock per SM of the architecture) × the maximum
 *     SM clock (cudaDevAttrClockRate). Per SM per clock (NVIDIA's architecture whitepapers):
 *       sm_70        FP16 1024                    FP32 128
 *       sm_75        FP16 1024                    FP32 128
 *       sm_80        FP16 / BF16 2048, TF32 1024  FP32 128
 *       sm_86, 89    FP16 / BF16 1024, TF32 512   FP32 256   (GeForce: half that for FP16)
 *       sm_90        FP16 / BF16 4096, TF32 2048  FP32 256
 *     (the datasheet's H100 SXM tensor figures work out to 4096 × 132 SMs × 1830 MHz, its FP32
 *     figure to 256 × 132 × 1980 MHz: the tensor peak is quoted below the maximum clock, so on
 *     such parts the estimate runs high — why the datasheet rows come first);
 *  4. unknown: NAN ("n/a"): the CPU backend, or an architecture not in the table.
 * Peak memory bandwidth: PEAK_GBPS in the environment, else 2 (double data rate) × the memory clock
 * (cudaDevAttrMemoryClockRate, kHz) × the bus width (cudaDevAttrGlobalMemoryBusWidth, bits) / 8. */
#ifndef PEAK_H
#define PEAK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The math a convolution runs in, as a peak is quoted: "tf32", "fp16", "bf16" or "fp32". */
typedef enum { MATH_FP32 = 0, MATH_TF32, MATH_FP16, MATH_BF16 } PeakMath;
const char *peak_math_name(PeakMath m);

/* Dense peak TFLOP/s of CUDA device `ordinal` (ordinal < 0: the CPU backend) for `math`; NAN when
 * unknown. `source` (len bytes, may be NULL) says where the number came from. A PEAK_TFLOPS that is
 * not a positive number is a user error (one line naming the fix, exit 2). */
double peak_tflops(int ordinal, PeakMath math, char *source, size_t len);

/* Peak memory bandwidth of CUDA device `ordinal` in GB/s (1e9 bytes/s), and where it came from;
 * NAN when unknown. */
double peak_mem_gbps(int ordinal, char *source, size_t len);

#ifdef __cplusplus
}
#endif

#endif
