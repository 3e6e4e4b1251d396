"""clip_fixture.py — torch.nn.utils.clip_grad_norm_ on a few gradient lists, for tests/test_clip.c.

    python3 tests/torch/clip_fixture.py [OUT]  (default tests/fixtures/clip.bin; CPU is enough)

Each case is a list of float32 gradient tensors (the sizes of a small CNN's parameters, 4 353 values
in all: not a multiple of any vector width) clipped in place by clip_grad_norm_(params, max_norm)
with torch's defaults (norm_type 2, foreach where supported, error_if_nonfinite False):
  clipped  norm far above max_norm: every gradient scaled by max_norm / (norm + 1e-6)
  below    norm below max_norm: the coefficient clamps to 1, no value changes
  eps      norm equal to a tiny max_norm: the 1e-6 still clips it (by 1/1.1)
  zero     all gradients zero: norm 0, nothing changes
  inf      one gradient +inf: norm inf, the coefficient 0 (finite values become 0, the inf NaN)
  large    one finite gradient of 1e19: its square, 1e38, still fits fp32; clipped as usual
  huge     one finite gradient of 2e19: its square overflows torch's fp32 sum, so the norm is inf
           and the coefficient 0 — every gradient becomes 0 (a diverging run's step)
Records: CASE.grads [n] f32 (before, the tensors concatenated), CASE.max_norm [1] f64,
CASE.norm [1] f32 (clip_grad_norm_'s return value: the norm before clipping), CASE.out [n] f32.
Written by fixtures.py (the container tests/test_util.c reads).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402

SIZES = [432, 16, 16, 2304, 16, 16, 1152, 32, 32, 320, 10, 7]  # a small CNN's shapes: convs, norms, a head
N = sum(SIZES)


def draw(seed, scale):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, generator=g) * scale).float()


def case(records, name, flat, max_norm):
    params = []
    at = 0
    for n in SIZES:
        p = torch.nn.Parameter(torch.zeros(n))
        p.grad = flat[at:at + n].clone()
        params.append(p)
        at += n
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    out = torch.cat([p.grad for p in params])
    records[name + ".grads"] = flat.numpy()
    records[name + ".max_norm"] = torch.tensor([max_norm], dtype=torch.float64).numpy()
    records[name + ".norm"] = norm.reshape(1).float().numpy()
    records[name + ".out"] = out.detach().numpy()
    print(f"{name}: norm {norm.item():.9g}, max_norm {max_norm:g}", file=sys.stderr)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures", "clip.bin")
    records = {}
    case(records, "clipped", draw(1, 0.5), 1.0)
    case(records, "below", draw(2, 1e-3), 5.0)
    eps = draw(3, 1.0)
    eps = (eps / eps.double().norm().float() * 1e-5).float()  # norm 1e-5 (to float rounding)
    case(records, "eps", eps, 1e-5)
    case(records, "zero", torch.zeros(N), 1.0)
    inf = draw(4, 0.1)
    inf[1234] = float("inf")
    case(records, "inf", inf, 1.0)
    for name, seed, spike in (("large", 5, 1e19), ("huge", 6, 2e19)):
        flat = draw(seed, 0.1)
        flat[2500] = spike
        case(records, name, flat, 1.0)
    fixtures.write(out, records)
    print(f"wrote {out} (torch {torch.__version__})", file=sys.stderr)


if __name__ == "__main__":
    main()
