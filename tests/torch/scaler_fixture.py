"""scaler_fixture.py — torch.amp.GradScaler's scale trajectories, for ./stage5 --show-scaler.

    python3 tests/torch/scaler_fixture.py > tests/fixtures/scaler.txt
    python3 tests/torch/scaler_fixture.py cuda | tail -n +2 | diff - <(tail -n +2 tests/fixtures/scaler.txt)  # CUDA too

Drives a real GradScaler (on the CPU: the same _amp_update_scale_ rule as on CUDA) with one
parameter whose gradient is finite (F) or inf (I) at each step, and records get_scale() after every
update(). One line per case:  PATTERN GROWTH_INTERVAL INIT_SCALE GROWTH BACKOFF: s1 s2 ... (%.9g).
tests/test_amp.c runs ./stage5 --show-scaler on each and compares the numbers exactly.
"""
import sys

import torch

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cpu"

CASES = [
    ("F", 2000, 65536.0, 2.0, 0.5),
    ("I", 2000, 65536.0, 2.0, 0.5),
    ("FFFFFFFF", 2, 65536.0, 2.0, 0.5),
    ("FFFFFFFFFFFF", 3, 1024.0, 2.0, 0.5),
    ("IIIFFFFIFFFF", 2, 65536.0, 2.0, 0.5),
    ("FIFIFIFIFI", 1, 8.0, 2.0, 0.5),
    ("IIIIIIIIIIIIIIIIIIII", 2000, 65536.0, 2.0, 0.5),
    ("FFFFFFFFFF", 1, 2.0**120, 2.0, 0.5),          # growth stops below fp32's inf
    ("FFFIFFFFFFIFFF", 4, 3.0, 2.0, 0.5),
    ("FFIFFIFF", 2, 1000.0, 3.0, 0.25),               # non-power-of-two factors: float rounding
    ("IIIII", 10, 1e-40, 2.0, 0.5),                   # into fp32 subnormals
    ("FFFFFF", 1, 1.5, 1.1, 0.5),
]


def trajectory(pattern, interval, init, growth, backoff):
    p = torch.nn.Parameter(torch.zeros(1, device=DEVICE))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler(DEVICE, init_scale=init, growth_factor=growth, backoff_factor=backoff,
                                  growth_interval=interval)
    out = []
    for c in pattern:
        opt.zero_grad()
        scaler.scale(p.sum()).backward()  # creates the scale lazily, as in a real loop
        p.grad.fill_(float("inf") if c == "I" else 1.0)
        scaler.step(opt)
        scaler.update()
        out.append(scaler.get_scale())
    return out


if __name__ == "__main__":
    print(f"# torch {torch.__version__} ({DEVICE}): pattern growth_interval init_scale growth_factor backoff_factor: scales")
    for case in CASES:
        pattern, interval, init, growth, backoff = case
        scales = trajectory(*case)
        print(f"{pattern} {interval} {init!r} {growth!r} {backoff!r}: " + " ".join(f"{s:.9g}" for s in scales))
