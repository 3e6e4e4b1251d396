/* test_flops.c — the model's FLOPs per training step (model_flops) and what the trainer reports with
 * them: against PyTorch's own counter (tests/fixtures/flops.txt, made by tests/torch/flop_count.py),
 * against a count derived here from the architecture alone, and in ./stage1's summary. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "peak.h"
#include "tests.h"

static Device cpu(void) {
    Device d = {0};
    device_init(&d, DEV_CPU, 0, -1);
    return d;
}

/* Every line of the fixture: torch's forward and backward FLOPs per image equal ours, for both
 * architectures and both --norm settings; and the count is linear in the batch. */
START_TEST(flops_match_pytorch_flop_counter) {
    char path[512], line[256];
    snprintf(path, sizeof path, "%s/tests/fixtures/flops.txt", test_root());
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "no %s (tests/torch/flop_count.py makes it)", path);
    Device d = cpu();
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char arch[16], norm[8];
        long long fwd, bwd;
        ck_assert_int_eq(sscanf(line, "%15s %7s %lld %lld", arch, norm, &fwd, &bwd), 4);
        Model *m = model_create(&d, arch, !strcmp(norm, "bn"), 2, 1);
        int64_t forward = -1, total = model_flops(m, 1, &forward);
        ck_assert_msg(forward == fwd && total - forward == bwd, "%s %s: ours %lld + %lld, torch %lld + %lld", arch,
                      norm, (long long)forward, (long long)(total - forward), fwd, bwd);
        int64_t forward128, total128 = model_flops(m, 128, &forward128);
        ck_assert(total128 == 128 * total && forward128 == 128 * forward);
        ck_assert(model_flops(m, 128, NULL) == total128);
        model_destroy(m);
        lines++;
    }
    fclose(f);
    ck_assert_int_eq(lines, 4);
    device_destroy(&d);
}
END_TEST

/* One convolution's forward FLOPs per image: 2 per multiply-add, hout = (h + 2·pad − k)/stride + 1. */
static int64_t conv_flops(int cin, int cout, int k, int stride, int h) {
    int pad = k / 2, hout = (h + 2 * pad - k) / stride + 1;
    return 2LL * cout * hout * hout * cin * k * k;
}

/* The count derived from the architecture alone (the CIFAR ResNets of models.py): a 3×3 stem at
 * 32×32, BasicBlocks (two 3×3 convs, a 1×1 strided shortcut when the shape changes), a linear
 * layer on the pooled features. Backward = 2 × forward − the stem's data gradient. */
static void expected(const char *arch, int64_t *fwd, int64_t *bwd) {
    int r18 = !strcmp(arch, "resnet18");
    int stem = r18 ? 64 : 16;
    int widths18[8] = {64, 64, 128, 128, 256, 256, 512, 512}, strides18[8] = {1, 1, 2, 1, 2, 1, 2, 1};
    int widthsT[2] = {32, 64}, stridesT[2] = {2, 2};
    int *widths = r18 ? widths18 : widthsT, *strides = r18 ? strides18 : stridesT, blocks = r18 ? 8 : 2;
    int64_t first = conv_flops(3, stem, 3, 1, 32), f = first;
    int cin = stem, h = 32;
    for (int b = 0; b < blocks; b++) {
        int cout = widths[b], s = strides[b];
        f += conv_flops(cin, cout, 3, s, h);
        int ho = (h + 2 - 3) / s + 1;
        f += conv_flops(cout, cout, 3, 1, ho);
        if (s != 1 || cin != cout) f += conv_flops(cin, cout, 1, s, h);
        cin = cout, h = ho;
    }
    f += 2LL * cin * 10; /* linear: 512 (tiny: 64) features → 10 classes */
    *fwd = f;
    *bwd = 2 * f - first;
}

START_TEST(flops_follow_from_the_architecture) {
    Device d = cpu();
    const char *archs[] = {"tiny", "resnet18"};
    for (int i = 0; i < 2; i++) {
        int64_t fwd, bwd, forward;
        expected(archs[i], &fwd, &bwd);
        Model *m = model_create(&d, archs[i], 1, 2, 1);
        int64_t total = model_flops(m, 1, &forward);
        ck_assert_msg(forward == fwd && total == fwd + bwd, "%s: %lld/%lld vs %lld/%lld", archs[i],
                      (long long)forward, (long long)total, (long long)fwd, (long long)(fwd + bwd));
        model_destroy(m);
    }
    /* the published figure: CIFAR ResNet-18 is 0.56 G multiply-adds per image forward */
    int64_t fwd, bwd;
    expected("resnet18", &fwd, &bwd);
    ck_assert_msg(fabs(fwd / 2 / 0.5557e9 - 1) < 0.001, "%lld multiply-adds", (long long)fwd / 2);
    device_destroy(&d);
}
END_TEST

/* A number from the "summary" record of a report ("key":value); NAN for null, -1 when missing. */
static double summary_num(const char *rep, const char *key) {
    const char *s = strstr(rep, "\"type\":\"summary\"");
    if (!s) return -1;
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(s, k);
    if (!p) return -1;
    p += strlen(k);
    return strncmp(p, "null", 4) ? strtod(p, NULL) : NAN;
}

/* ./stage1 on the CPU: the summary's FLOPs are model_flops' for every image of a step, the rate is
 * FLOPs over the median step time, the peak is n/a — unless PEAK_TFLOPS states one. */
START_TEST(stage1_reports_flops_and_peak) {
    char *dir = test_tmpdir(), cmd[2048], path[512], *out;
    /* the summary's "peak_math": the math the convolutions run in, by name */
    const char *math[] = {"fp32", "tf32", "fp16", "bf16"};
    for (int k = MATH_FP32; k <= MATH_BF16; k++) ck_assert_str_eq(peak_math_name((PeakMath)k), math[k]);
    ck_assert_str_eq(peak_math_name((PeakMath)(MATH_BF16 + 1)), "?");
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    for (int with_peak = 0; with_peak < 2; with_peak++) {
        snprintf(cmd, sizeof cmd,
                 "%s %s/stage1 --device cpu --model tiny --train-size 320 --test-size 32 --batch-size 32 "
                 "--epochs 1 --progress off --report %s",
                 with_peak ? "PEAK_TFLOPS=0.25" : "env -u PEAK_TFLOPS", test_root(), path);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 0, "%s\n%s", cmd, out);
        char *rep = test_slurp(path, NULL);
        ck_assert(rep);
        Device d = cpu();
        Model *m = model_create(&d, "tiny", 1, 2, 1);
        double per_image = (double)model_flops(m, 1, NULL) / 1e9;
        model_destroy(m);
        device_destroy(&d);
        double step = summary_num(rep, "model_gflop_per_step"), ms = summary_num(rep, "ms_per_iter_median");
        double achieved = summary_num(rep, "achieved_tflops"), peak = summary_num(rep, "peak_tflops");
        double fraction = summary_num(rep, "peak_fraction");
        ck_assert_msg(fabs(summary_num(rep, "model_gflop_per_image") / per_image - 1) < 1e-8, "%s", rep);
        ck_assert_msg(fabs(step / (32 * per_image) - 1) < 1e-8, "%s", rep);
        ck_assert_msg(ms > 0 && fabs(achieved / (step / ms) - 1) < 1e-6, "%s", rep);
        ck_assert_msg(summary_num(rep, "peak_devices") == 1, "%s", rep);
        ck_assert_msg(strstr(rep, "\"peak_math\":\"fp32\""), "%s", rep);
        if (with_peak) {
            ck_assert_msg(peak == 0.25 && fabs(fraction / (achieved / 0.25) - 1) < 1e-6, "%s", rep);
            ck_assert_msg(strstr(out, "% of the fp32 dense peak 0.2") && strstr(out, "PEAK_TFLOPS"), "%s", out);
        } else {
            ck_assert_msg(isnan(peak) && isnan(fraction), "%s", rep);
            ck_assert_msg(strstr(out, "TFLOP/s | peak n/a (CPU backend"), "%s", out);
        }
        ck_assert_msg(strstr(out, "  compute: 1.5 GFLOP/step"), "%s", out); /* 32 × 45.8 MFLOP */
        ck_assert_msg(!strstr(out, "note: a full step"), "%s", out); /* 320 images: full steps */
        free(rep), free(out);
    }
    /* a set smaller than one step: every step is short, and the full step's figures say so */
    snprintf(cmd, sizeof cmd, "%s/stage1 --device cpu --model tiny --train-size 20 --test-size 32 --batch-size 32 "
             "--epochs 1 --progress off", test_root());
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "  compute: 1.5 GFLOP/step") &&
                  strstr(out, "note: a full step is 32 images and the training set has 20, so every step was "
                              "shorter") && strstr(out, "a --batch-size of at most 20 fits the set"), "%s", out);
    free(out);
    /* …and where even a batch of 1 is too many micro-batches, the fix is --accum-steps */
    snprintf(cmd, sizeof cmd, "timeout -k 5 120 %s/stage4 --device cpu --nproc-per-node 1 --model tiny --train-size 4 "
             "--test-size 16 --batch-size 1 --accum-steps 8 --epochs 1 --progress off --master-port %d", test_root(),
             test_free_port());
    ck_assert_int_eq(test_run(cmd, &out), 0);
    ck_assert_msg(strstr(out, "a full step is 8 images and the training set has 4") &&
                  strstr(out, "--batch-size 1 with an --accum-steps of at most 4 fits the set"), "%s", out);
    free(out);
    /* a PEAK_TFLOPS that is not a positive number: one line, exit 2, before any training — a number
     * with more after it ("2.5x", a unit typed in) included: read as its leading 2.5, it would scale the
     * report's peak fraction silently */
    const char *bad[] = {"fast", "0", "-3", "inf", "2.5x"};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        char want[64];
        snprintf(cmd, sizeof cmd, "PEAK_TFLOPS=%s %s/stage1 --device cpu --model tiny --train-size 320 "
                 "--test-size 32 --batch-size 32 --epochs 1 --progress off", bad[i], test_root());
        snprintf(want, sizeof want, "PEAK_TFLOPS=%s is not a positive number", bad[i]);
        int rc = test_run(cmd, &out);
        ck_assert_msg(rc == 2 && strstr(out, want) && !strstr(out, "epoch 1/1"), "rc %d:\n%s", rc, out);
        free(out);
    }
    /* …in stages 3–5 once, by the launcher: each worker, which inherits it, said the same line */
    snprintf(cmd, sizeof cmd, "PEAK_TFLOPS=fast timeout -k 5 120 %s/stage3 --device cpu --model tiny --train-size 64 "
             "--test-size 32 --progress off --nproc-per-node 2 --standalone", test_root());
    int rc = test_run(cmd, &out);
    const char *line = "PEAK_TFLOPS=fast is not a positive number", *said = strstr(out, line);
    ck_assert_msg(rc == 2 && said && !strstr(said + strlen(line), line) && !strstr(out, "launching"), "rc %d:\n%s",
                  rc, out);
    free(out);
    free(dir);
}
END_TEST

/* An optimizer step of stage 4 is K micro-batches on every rank: the summary's FLOPs per step count
 * every image of it (2 ranks × 2 micro-batches of 16), not one micro-batch's. */
START_TEST(stage4_flops_count_every_image_of_a_step) {
    char *dir = test_tmpdir(), cmd[2048], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 120 %s/stage4 --device cpu --model tiny --train-size 256 --test-size 32 --batch-size 16 "
             "--accum-steps 2 --nproc-per-node 2 --steps 2 --epochs 1 --workers 0 --progress off --master-port %d "
             "--report %s", test_root(), test_free_port(), path);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s\n%s", cmd, out);
    char *rep = test_slurp(path, NULL);
    ck_assert(rep);
    double image = summary_num(rep, "model_gflop_per_image"), step = summary_num(rep, "model_gflop_per_step");
    ck_assert_msg(image > 0 && fabs(step / (2 * 2 * 16 * image) - 1) < 1e-8, "%g GFLOP per image, %g per step", image,
                  step);
    free(rep), free(out), free(dir);
}
END_TEST

/* The CPU backend is one physical device to the peak, however many logical ones DataParallel splits it
 * into (trainer.c's physical_devices keys a device by host and ordinal, and a CPU device has none: -1):
 * ./stage2's two virtual devices on one host's cores multiply PEAK_TFLOPS by 1, not 2. The stage 1 and
 * stage 4 runs above have one device per process, so a CPU device given an ordinal of its own (its
 * index) passed them. */
START_TEST(stage2_cpu_devices_are_one_to_the_peak) {
    char *dir = test_tmpdir(), cmd[2048], path[512], *out;
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(cmd, sizeof cmd,
             "PEAK_TFLOPS=0.25 timeout -k 5 120 %s/stage2 --device cpu --gpus 2 --model tiny --train-size 128 "
             "--test-size 32 --batch-size 16 --steps 2 --epochs 1 --progress off --report %s", test_root(), path);
    int rc = test_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s\n%s", cmd, out);
    char *rep = test_slurp(path, NULL);
    ck_assert(rep);
    ck_assert_msg(summary_num(rep, "world_size") == 2 && summary_num(rep, "peak_devices") == 1 &&
                      summary_num(rep, "peak_tflops") == 0.25,
                  "two CPU devices of one host: %s", rep);
    free(rep), free(out), free(dir);
}
END_TEST

Suite *suite_flops(void) {
    Suite *s = suite_create("flops");
    TCase *tc = tcase_create("flops");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, flops_match_pytorch_flop_counter);
    tcase_add_test(tc, flops_follow_from_the_architecture);
    tcase_add_test(tc, stage1_reports_flops_and_peak);
    tcase_add_test(tc, stage4_flops_count_every_image_of_a_step);
    tcase_add_test(tc, stage2_cpu_devices_are_one_to_the_peak);
    suite_add_tcase(s, tc);
    return s;
}
