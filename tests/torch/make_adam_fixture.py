"""make_adam_fixture.py — torch.optim.Adam's trajectory on a flat buffer, for tests/test_adam.c.

    python3 tests/torch/make_adam_fixture.py [OUT]  (default tests/fixtures/adam.bin; CPU is enough)

Two cases, each a float32 parameter vector of 1003 values (not a multiple of the CPU kernels' vector
width, so their scalar tails are exercised too) stepped 6 times by torch.optim.Adam (foreach=False:
the single-tensor path) with a different learning rate every step, as a schedule sets it:
  wd    weight_decay 0.1 (large, so L2-into-the-gradient and AdamW's decoupled decay differ clearly)
  nowd  weight_decay 0, gradients spanning 1e-9 … 1 (so eps and the bias corrections both matter)
Records: CASE.p0 [n] f32, CASE.grads [steps][n] f32, CASE.lrs [steps] f64, CASE.wd [1] f64,
CASE.params [steps][n] f32 (after each step). Same container as fixtures.py, written with struct.
"""
import os
import sys
import struct

import torch

N, STEPS = 1003, 6
DTYPE = {torch.float32: (0, "f"), torch.float64: (1, "d")}


def record(f, name, t):
    t = t.contiguous().cpu()
    code, fmt = DTYPE[t.dtype]
    nb = name.encode()
    f.write(struct.pack("<I", len(nb)) + nb)
    f.write(struct.pack("<II", code, t.dim()))
    f.write(struct.pack("<%dI" % t.dim(), *t.shape))
    f.write(struct.pack("<%d%s" % (t.numel(), fmt), *t.flatten().tolist()))


# (name, weight_decay, the scale of each step's gradients, seed): adam_scaler_fixture.py steps the same
CASES = [("wd", 0.1, [1.0, 0.5, 2.0, 1.0, 0.1, 1.0], 1),
         ("nowd", 0.0, [1e-9, 1e-6, 1e-3, 1.0, 1e-4, 1e-8], 2)]


def draw(grad_scales, seed):
    """A case's starting parameters, its STEPS gradients and learning rates."""
    g = torch.Generator().manual_seed(seed)
    p0 = (torch.rand(N, generator=g) * 2 - 1).float()
    grads = torch.stack([torch.randn(N, generator=g) * s for s in grad_scales]).float()
    grads[:, ::17] = 0  # some gradients are exactly zero: the update then rests on m and eps
    lrs = torch.tensor([1e-3, 1e-3, 5e-4, 2e-3, 1e-2, 3e-4], dtype=torch.float64)
    return p0, grads, lrs


def case(f, name, wd, grad_scales, seed):
    p0, grads, lrs = draw(grad_scales, seed)
    p = torch.nn.Parameter(p0.clone())
    opt = torch.optim.Adam([p], lr=1e-3, weight_decay=wd, foreach=False)
    out = []
    for s in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = float(lrs[s])
        p.grad = grads[s].clone()
        opt.step()
        out.append(p.detach().clone())
    record(f, name + ".p0", p0)
    record(f, name + ".grads", grads)
    record(f, name + ".lrs", lrs)
    record(f, name + ".wd", torch.tensor([wd], dtype=torch.float64))
    record(f, name + ".params", torch.stack(out))


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures", "adam.bin")
    with open(path, "wb") as f:
        f.write(b"FIXT0001")
        for c in CASES:
            case(f, *c)
    print(f"wrote {os.path.normpath(path)} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
