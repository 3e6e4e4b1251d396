"""bench_flops.py — achieved TFLOP/s and its fraction of the GPU's peak, for the bench tables.

Imported by the tables of tests/bench_stage*.sh and tests/compare_table.py. A stage's "summary"
record carries what is needed (common/trainer.c): model_gflop_per_image / _per_step (model_flops in
common/model.h: conv + linear, forward + backward, 2 FLOPs per multiply-add), achieved_tflops, and
peak_tflops over peak_devices GPUs for the convolutions' math (peak_math; common/peak.h says where
the peak comes from). A PyTorch row trains the same model at the same batch, so its FLOPs per image
are the stage's: its rate is those FLOPs over its own step time, against the peak of the stage row
that runs the same math on the same GPUs.
"""
import math

HEAD = f"{'TFLOP/s':>8s} {'of peak':>7s}"  # the two columns, right-aligned like the others


def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def stage(summary):
    """(achieved TFLOP/s, fraction of peak) of a stage's summary record; None where unknown."""
    if not summary:
        return None, None
    a, p = _num(summary.get("achieved_tflops")), _num(summary.get("peak_tflops"))
    return a, (a / p if a is not None and p else None)


def like(ref, ms, images, gpus=1):
    """(TFLOP/s, fraction) of a run of `images` images per step at `ms` per step (a PyTorch row) on
    `gpus` GPUs, with the FLOPs per image and the per-GPU peak of `ref`, a stage summary of the same
    model and math."""
    if not ref or _num(ms) is None or ms <= 0:
        return None, None
    per_image = _num(ref.get("model_gflop_per_image"))
    if per_image is None:
        return None, None
    a = per_image * images / ms  # GFLOP per ms = TFLOP/s
    p, n = _num(ref.get("peak_tflops")), _num(ref.get("peak_devices"))
    return a, (a / (p / n * gpus) if p and n else None)


def cells(pair):
    """The two cells as strings: '56.3', '11.4%' (or 'n/a')."""
    a, f = pair
    return ("n/a" if a is None else f"{a:.1f}" if a >= 1 else f"{a:.3g}",
            "n/a" if f is None else f"{100 * f:.1f}%")


def cols(pair):
    """The two cells, padded to HEAD's widths."""
    a, f = cells(pair)
    return f"{a:>8s} {f:>7s}"
