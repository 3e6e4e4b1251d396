#!/usr/bin/env python3
"""kernel_breakdown.py — where one training step's GPU time goes, from an ncu CSV.

    python3 tests/kernel_breakdown.py NCU.csv [--step-ms MS] [--skip N] [--steps K]

NCU.csv is `ncu --csv --metrics gpu__time_duration.sum` over a short training run (see
tests/kernel_breakdown.sh). Kernels are split into steps at the optimizer's kernel (sgd / adam: the
last kernel of every step); after skipping N warm-up steps, K steps are averaged. Each kernel goes
into a category by its name (cuDNN and cuBLAS name their kernels after what they do), and the table
gives microseconds per step, share, and launches per step. --step-ms is the step time measured
without the profiler: the difference to the kernels' sum is the GPU's idle time between kernels
(launch gaps, host-bound stretches) — ncu serialises kernels, so a sum can only be compared with a
step time of the same stream."""
import csv
import re
import sys
from collections import defaultdict

CATEGORIES = [  # first match wins: (category, regex on the lower-cased kernel name)
    ("optimizer", r"sgd|adam"),
    ("amp scaler", r"amp_|scale_by_device|count_zero"),
    ("layout transforms", r"nchwtonhwc|nhwctonchw|transform|transpose"),
    ("conv wgrad", r"wgrad|bwd_filter|backward_filter|filter_"),
    ("conv dgrad", r"dgrad|bwd_data|backward_data"),
    ("conv fprop", r"fprop|implicit_gemm|conv2d|convolve|winograd|fft|xmma|cutlass|sm\d+_|gemm"),
    ("batch norm", r"bn_|batch_?norm|batchnorm"),
    ("relu", r"relu"),
    ("add / grad copy", r"add_forward|grad_pass|add_inplace"),
    ("casts", r"cast"),
    ("loss", r"xent|cross|softmax|loss"),
    ("pool / linear bias", r"pool|bias"),
    ("copies / fills", r"copy|memcpy|fill"),
]


def category(name):
    n = name.lower()
    for cat, rx in CATEGORIES:
        if re.search(rx, n):
            return cat
    return "other"


def to_us(value, unit):
    v = float(value.replace(",", ""))
    return v * {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3, "second": 1e6}.get(unit, 1)


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    path, step_ms, skip, nsteps = args[0], None, 2, 3
    i = 1
    while i < len(args):
        if args[i] == "--step-ms": step_ms = float(args[i + 1]); i += 2
        elif args[i] == "--skip": skip = int(args[i + 1]); i += 2
        elif args[i] == "--steps": nsteps = int(args[i + 1]); i += 2
        else: sys.exit(f"kernel_breakdown.py: unknown argument {args[i]}")
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own progress lines before the CSV
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        rows.append((int(r["ID"]), r["Kernel Name"], to_us(r["Metric Value"], r["Metric Unit"])))
    rows.sort()
    ends = [k for k, (_, name, _) in enumerate(rows) if re.search(r"sgd|adam_kernel", name.lower())]
    if len(ends) < skip + nsteps + 1:
        sys.exit(f"kernel_breakdown.py: {len(ends)} optimizer kernels in {path}: need {skip + nsteps + 1} "
                 "(profile more steps or lower --skip/--steps)")
    lo, hi = ends[skip] + 1, ends[skip + nsteps] + 1
    per_cat, per_name = defaultdict(lambda: [0.0, 0]), defaultdict(lambda: [0.0, 0])
    for _, name, us in rows[lo:hi]:
        c = per_cat[category(name)]; c[0] += us / nsteps; c[1] += 1
        short = re.sub(r"\(.*", "", name)[:70]
        p = per_name[short]; p[0] += us / nsteps; p[1] += 1
    total = sum(v[0] for v in per_cat.values())
    print(f"kernels of steps {skip + 1}..{skip + nsteps} (mean of {nsteps}), from {path}")
    print(f"{'category':<20} {'us/step':>9} {'share':>7} {'launches':>9}")
    for cat, (us, n) in sorted(per_cat.items(), key=lambda kv: -kv[1][0]):
        print(f"{cat:<20} {us:9.0f} {100 * us / total:6.1f}% {n / nsteps:9.0f}")
    print(f"{'kernels, sum':<20} {total:9.0f} {'':>7} {sum(v[1] for v in per_cat.values()) / nsteps:9.0f}")
    if step_ms:
        gap = step_ms * 1e3 - total
        print(f"{'step (no profiler)':<20} {step_ms * 1e3:9.0f}")
        print(f"{'idle between kernels':<20} {gap:9.0f} {100 * gap / (step_ms * 1e3):6.1f}% of the step")
    print("\ntop kernels (us/step, launches/step, category):")
    for name, (us, n) in sorted(per_name.items(), key=lambda kv: -kv[1][0])[:18]:
        print(f"  {us:7.0f} {n / nsteps:4.0f}  {category(name):<18} {name}")


if __name__ == "__main__":
    main()
