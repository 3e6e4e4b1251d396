"""sgd_scaler_fixture.py — torch.optim.SGD with momentum under torch.amp.GradScaler, skipping steps,
for tests/test_adam.c (the optimizers' oracle tests live there) and stage 5's lesson.

    python3 tests/torch/sgd_scaler_fixture.py [OUT] (needs a CUDA GPU: fused SGD; default OUT
                                                    tests/fixtures/sgd_scaler.bin)

GradScaler's contract is that an overflowed step is skipped: "optimizer.step() is skipped", state and
all. With a plain SGD (foreach, the default) the scaler keeps that promise on the host: it reads
found_inf and does not call step(). With SGD(fused=True) it hands found_inf and the scale to the
optimizer instead (_step_supports_amp_scaling), and the optimizer must honour them on the device.
This records both, from the same start and gradients, along PATTERN — F: the next of the 6 gradients,
scaled; I: a gradient with inf and NaN in it — so the test can hold stage 5's SGD (which skips on the
device, as the fused path means to) to the contract, and say what the fused path of the torch that
made the fixture really does. Momentum 0.9, weight decay 5e-4, init_scale 1024 (every scale a power of
two: scaling and unscaling are exact). The first attempt is an overflow on purpose: fp16 training
can meet one at once (its scale starts at 2^16), and it is where PyTorch's SGD has no momentum
buffer yet.
Records, for CASE in foreach, fused: CASE.pattern [attempts] f64 (1 = skipped), CASE.p0 [n] f32,
CASE.grads [6][n] f32, CASE.lrs [6] f64, CASE.params [attempts][n] f32 and CASE.buf [attempts][n] f32
(parameters and momentum buffer after each attempt; NaN where torch holds no buffer yet),
CASE.scales [attempts] f64. Prints, per attempt, how far the fused trajectory is from the foreach one.
"""
import os
import sys

import torch

from make_adam_fixture import N, STEPS, record

PATTERN = "IFFIFFFF"
MOMENTUM, WD = 0.9, 5e-4
LRS = torch.tensor([0.1, 0.1, 0.05, 0.1, 0.02, 0.1], dtype=torch.float64)


def draw(seed=3):
    g = torch.Generator().manual_seed(seed)
    p0 = (torch.rand(N, generator=g) * 2 - 1).float()
    grads = (torch.randn(STEPS, N, generator=g) * 0.5).float()
    grads[:, ::17] = 0
    return p0, grads


def case(f, name, fused):
    p0, grads = draw()
    p = torch.nn.Parameter(p0.clone().cuda())
    opt = torch.optim.SGD([p], lr=0.1, momentum=MOMENTUM, weight_decay=WD,
                          **({"fused": True} if fused else {"foreach": True}))
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, growth_interval=1000)
    bad = torch.full((N,), float("inf"))
    bad[::3] = float("nan")
    scaler.scale(torch.zeros((), device="cuda"))  # creates the scale tensor (what scaler.scale(loss) does first)
    taken, params, bufs, scales = 0, [], [], []
    for c in PATTERN:
        scale = scaler.get_scale()
        if c == "F":
            for group in opt.param_groups:
                group["lr"] = float(LRS[taken])
            p.grad = (grads[taken] * scale).cuda()
            taken += 1
        else:
            p.grad = bad.clone().cuda()
        scaler.step(opt)
        scaler.update()
        params.append(p.detach().cpu().clone())
        b = opt.state[p].get("momentum_buffer") if p in opt.state else None
        bufs.append(b.detach().cpu().clone() if b is not None else torch.full((N,), float("nan")))
        scales.append(scaler.get_scale())
    assert taken == STEPS
    record(f, name + ".pattern", torch.tensor([c == "I" for c in PATTERN], dtype=torch.float64))
    record(f, name + ".p0", p0)
    record(f, name + ".grads", grads)
    record(f, name + ".lrs", LRS)
    record(f, name + ".params", torch.stack(params))
    record(f, name + ".buf", torch.stack(bufs))
    record(f, name + ".scales", torch.tensor(scales, dtype=torch.float64))
    return torch.stack(params), torch.stack(bufs)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures", "sgd_scaler.bin")
    with open(path, "wb") as f:
        f.write(b"FIXT0001")
        pf, bf = case(f, "foreach", False)
        pu, bu = case(f, "fused", True)
    print(f"wrote {os.path.normpath(path)} (torch {torch.__version__}, {torch.cuda.get_device_name()})")
    print("attempt  kind  max|p_fused - p_foreach|  fused buffer finite  foreach holds a buffer")
    for a, c in enumerate(PATTERN):
        d = (pu[a] - pf[a]).abs().max().item()
        print(f"{a + 1:7d}  {c:4s}  {d:24.3g}  {str(bool(torch.isfinite(bu[a]).all())):19s}  "
              f"{not bool(torch.isnan(bf[a]).all())}")


if __name__ == "__main__":
    main()
