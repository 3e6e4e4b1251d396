"""adam_scaler_fixture.py — torch.optim.Adam(fused=True) under torch.amp.GradScaler, skipping steps, for
tests/test_adam.c.

    python3 tests/torch/adam_scaler_fixture.py [OUT] (needs a CUDA GPU: fused Adam; default OUT
                                                     tests/fixtures/adam_scaler.bin)

Stage 5 with --optimizer adam skips an overflowed step on the device, as torch's fused Adam does when
GradScaler hands it found_inf: nothing moves — parameters, both moments, and the step count that sets
the bias corrections. This records what torch does, so the test can hold ours to it: the two cases of
make_adam_fixture.py (the same seeds, gradients and learning rates), stepped through a GradScaler
(init_scale 1024, growth_interval 1000: every scale a power of two, so scaling and unscaling are
exact) along PATTERN — F: the next of the 6 gradients, scaled; I: a gradient with inf and NaN in it.
Records: CASE.pattern [attempts] f64 (1 = skipped), CASE.p0 [n] f32, CASE.grads [6][n] f32,
CASE.lrs [6] f64, CASE.wd [1] f64, CASE.params [attempts][n] f32 (after each attempt), CASE.scales
[attempts] f64 (the scale after each update).
"""
import os
import sys

import torch

from make_adam_fixture import CASES, N, STEPS, draw, record

PATTERN = "FIFFIIFFF"


def case(f, name, wd, grad_scales, seed):
    p0, grads, lrs = draw(grad_scales, seed)
    p = torch.nn.Parameter(p0.clone().cuda())
    opt = torch.optim.Adam([p], lr=1e-3, weight_decay=wd, fused=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, growth_interval=1000)
    bad = torch.full((N,), float("inf"))
    bad[::3] = float("nan")
    scaler.scale(torch.zeros((), device="cuda"))  # creates the scale tensor (what scaler.scale(loss) does first)
    taken, out, scales = 0, [], []
    for c in PATTERN:
        scale = scaler.get_scale()
        if c == "F":
            for group in opt.param_groups:
                group["lr"] = float(lrs[taken])
            p.grad = (grads[taken] * scale).cuda()
            taken += 1
        else:
            p.grad = bad.clone().cuda()
        scaler.step(opt)
        scaler.update()
        out.append(p.detach().cpu().clone())
        scales.append(scaler.get_scale())
    assert taken == STEPS
    record(f, name + ".pattern", torch.tensor([c == "I" for c in PATTERN], dtype=torch.float64))
    record(f, name + ".p0", p0)
    record(f, name + ".grads", grads)
    record(f, name + ".lrs", lrs)
    record(f, name + ".wd", torch.tensor([wd], dtype=torch.float64))
    record(f, name + ".params", torch.stack(out))
    record(f, name + ".scales", torch.tensor(scales, dtype=torch.float64))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures", "adam_scaler.bin")
    with open(path, "wb") as f:
        f.write(b"FIXT0001")
        for c in CASES:
            case(f, *c)
    print(f"wrote {os.path.normpath(path)} (torch {torch.__version__}, {torch.cuda.get_device_name()})")


if __name__ == "__main__":
    main()
