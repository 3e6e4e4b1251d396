/* peak.c — a GPU's peak FLOP/s and memory bandwidth: the override, the datasheet, the estimate (peak.h). */
#include "peak.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

#ifdef USE_CUDA
#include <cuda_runtime.h>
#endif

const char *peak_math_name(PeakMath m) {
    static const char *names[] = {"fp32", "tf32", "fp16", "bf16"};
    return m >= MATH_FP32 && m <= MATH_BF16 ? names[m] : "?";
}

static void say(char *source, size_t len, const char *fmt, ...) {
    if (!source || !len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(source, len, fmt, ap);
    va_end(ap);
}

/* NAME=value in the environment: 1 and *v when set; a value that is not a positive number is the
 * user's to fix. */
static int env_peak(const char *name, double *v) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    double x = strtod(s, &end);
    if (end == s || *end || !isfinite(x) || x <= 0)
        die_user("%s=%s is not a positive number: set it to the peak of one device (e.g. %s), or unset it",
                 name, s, !strcmp(name, "PEAK_TFLOPS") ? "PEAK_TFLOPS=494.7" : "PEAK_GBPS=4800");
    *v = x;
    return 1;
}

#ifdef USE_CUDA
/* NVIDIA's datasheet figures, dense (no 2:4 sparsity), TFLOP/s for fp32, tf32, fp16, bf16 — for a
 * part of that compute capability, SM count and a name that has `has` and not `not`. */
static const struct {
    int major, minor, sms;
    const char *has, *not, *part;
    double tflops[4];
} DATASHEET[] = {
    {9, 0, 132, "H100", "NVL", "H100 SXM", {66.9, 494.7, 989.4, 989.4}},
    {9, 0, 132, "H200", "NVL", "H200 SXM", {66.9, 494.7, 989.4, 989.4}}, /* GH200 too: the same figures */
    {8, 0, 108, "A100", NULL, "A100", {19.5, 156, 312, 312}},
};

/* Dense FLOP per clock per SM (fp32 on the CUDA cores; the rest on the tensor cores); 0: none. */
static const struct {
    int major, minor;
    double per_clock[4];
} PER_SM[] = {
    {7, 0, {128, 0, 1024, 0}},       {7, 5, {128, 0, 1024, 0}},       {8, 0, {128, 1024, 2048, 2048}},
    {8, 6, {256, 512, 1024, 1024}},  {8, 9, {256, 512, 1024, 1024}},  {9, 0, {256, 2048, 4096, 4096}},
};

static int attr(enum cudaDeviceAttr a, int ordinal) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, a, ordinal) != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it, the caller reports "unknown" */
        return 0;
    }
    return v;
}
#endif

double peak_tflops(int ordinal, PeakMath math, char *source, size_t len) {
    double v;
    if (env_peak("PEAK_TFLOPS", &v)) {
        say(source, len, "PEAK_TFLOPS in the environment");
        return v;
    }
    if (ordinal < 0) {
        say(source, len, "CPU backend; PEAK_TFLOPS=... states one");
        return NAN;
    }
#ifdef USE_CUDA
    int major = attr(cudaDevAttrComputeCapabilityMajor, ordinal);
    int minor = attr(cudaDevAttrComputeCapabilityMinor, ordinal);
    int sms = attr(cudaDevAttrMultiProcessorCount, ordinal);
    int khz = attr(cudaDevAttrClockRate, ordinal); /* the maximum SM clock */
    struct cudaDeviceProp prop;
    const char *name = cudaGetDeviceProperties(&prop, ordinal) == cudaSuccess ? prop.name : "";
    for (size_t i = 0; i < sizeof DATASHEET / sizeof DATASHEET[0]; i++)
        if (DATASHEET[i].major == major && DATASHEET[i].minor == minor && DATASHEET[i].sms == sms &&
            strstr(name, DATASHEET[i].has) && !(DATASHEET[i].not && strstr(name, DATASHEET[i].not))) {
            say(source, len, "NVIDIA %s datasheet, dense", DATASHEET[i].part);
            return DATASHEET[i].tflops[math];
        }
    for (size_t i = 0; i < sizeof PER_SM / sizeof PER_SM[0]; i++)
        if (PER_SM[i].major == major && PER_SM[i].minor == minor) {
            double per = PER_SM[i].per_clock[math];
            if (per == 0 || khz == 0) break;
            say(source, len, "estimate: %d SMs x %.0f FLOP/clock x %d MHz", sms, per, khz / 1000);
            return sms * per * khz * 1e3 / 1e12;
        }
    say(source, len, "no %s peak known for sm_%d%d (%s): set PEAK_TFLOPS", peak_math_name(math), major,
        minor, name);
#else
    say(source, len, "built without CUDA");
#endif
    return NAN;
}

double peak_mem_gbps(int ordinal, char *source, size_t len) {
    double v;
    if (env_peak("PEAK_GBPS", &v)) {
        say(source, len, "PEAK_GBPS in the environment");
        return v;
    }
#ifdef USE_CUDA
    if (ordinal >= 0) {
        int khz = attr(cudaDevAttrMemoryClockRate, ordinal), bits = attr(cudaDevAttrGlobalMemoryBusWidth, ordinal);
        if (khz > 0 && bits > 0) {
            say(source, len,
                "2 (DDR) x cudaDevAttrMemoryClockRate %d MHz x cudaDevAttrGlobalMemoryBusWidth %d bits / 8",
                khz / 1000, bits);
            return 2.0 * khz * 1e3 * (bits / 8.0) / 1e9;
        }
        say(source, len, "the driver reports no memory clock or bus width: set PEAK_GBPS");
        return NAN;
    }
#endif
    say(source, len, ordinal < 0 ? "CPU backend; PEAK_GBPS=... states one" : "built without CUDA");
    return NAN;
}
