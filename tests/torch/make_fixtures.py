"""make_fixtures.py — PyTorch as the outside oracle: writes tests/fixtures/*.bin for the C tests.

Run on a machine with PyTorch (the device machine has 2.11):
    python3 tests/torch/make_fixtures.py [OUTDIR]      (default: tests/fixtures)
The outputs are small and committed; `make test` compares the C CPU backend against them in CI.

  layers.bin   each op's forward and backward on fixed float64 inputs (conv, bn, relu, pool,
               linear, cross-entropy), computed by torch.nn.functional + autograd
  tiny.bin     tiny ResNet (bn and none): initial weights, a batch, the logits, the gradients of
               the first step, and the loss and weights after 2 SGD steps (momentum, weight decay)
  resnet18.bin ResNet-18's parameter names and shapes in state_dict order
  rng.bin      torch.randperm(n, generator=manual_seed(s)) for several n and s
  sampler.bin  DistributedSampler indices for many (N, R, seed, epoch, drop_last, shuffle, rank)
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402
from models import ResNet  # noqa: E402

torch.set_default_dtype(torch.float64)
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures")
os.makedirs(OUT, exist_ok=True)


def np64(t):
    # a copy: .numpy() shares memory, and batch_norm updates the running stats in place
    return t.detach().to(torch.float64).cpu().numpy().copy()


def layers():
    g = torch.Generator().manual_seed(1234)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    rec = {}
    for name, (n, cin, h, w, cout, k, s, p) in {
        "conv_a": (2, 3, 7, 7, 4, 3, 2, 1),
        "conv_b": (3, 4, 6, 6, 5, 1, 2, 0),
        "conv_c": (2, 3, 5, 5, 2, 3, 1, 1),
    }.items():
        x, wt = r(n, cin, h, w).requires_grad_(), r(cout, cin, k, k).requires_grad_()
        y = F.conv2d(x, wt, stride=s, padding=p)
        dy = r(*y.shape)
        y.backward(dy)
        rec.update({f"{name}.shape": np.array([n, cin, h, w, cout, k, s, p], np.int64),
                    f"{name}.x": np64(x), f"{name}.w": np64(wt), f"{name}.y": np64(y),
                    f"{name}.dy": np64(dy), f"{name}.dx": np64(x.grad), f"{name}.dw": np64(wt.grad)})
    # batch norm, training mode: batch statistics, running stats updated with the unbiased variance
    n, c, h, w = 3, 4, 5, 5
    x = (r(n, c, h, w) * 2 + 0.5).requires_grad_()
    gamma, beta = (r(c) * 0.5 + 1).requires_grad_(), r(c).requires_grad_()
    rm, rv = r(c) * 0.1, r(c).abs() + 0.5
    rec.update({"bn.x": np64(x), "bn.gamma": np64(gamma), "bn.beta": np64(beta),
                "bn.rm0": np64(rm), "bn.rv0": np64(rv)})
    y = F.batch_norm(x, rm, rv, gamma, beta, training=True, momentum=0.1, eps=1e-5)
    dy = r(*y.shape)
    y.backward(dy)
    rec.update({"bn.y": np64(y), "bn.dy": np64(dy), "bn.dx": np64(x.grad), "bn.dgamma": np64(gamma.grad),
                "bn.dbeta": np64(beta.grad), "bn.rm1": np64(rm), "bn.rv1": np64(rv)})
    with torch.no_grad():
        rec["bn.y_eval"] = np64(F.batch_norm(x, rm, rv, gamma, beta, training=False, eps=1e-5))
    # relu, global average pool, linear
    x = r(4, 6).requires_grad_()
    y = F.relu(x)
    dy = r(4, 6)
    y.backward(dy)
    rec.update({"relu.x": np64(x), "relu.y": np64(y), "relu.dy": np64(dy), "relu.dx": np64(x.grad)})
    x = r(2, 3, 4, 4).requires_grad_()
    y = F.adaptive_avg_pool2d(x, 1).flatten(1)
    dy = r(2, 3)
    y.backward(dy)
    rec.update({"pool.x": np64(x), "pool.y": np64(y), "pool.dy": np64(dy), "pool.dx": np64(x.grad)})
    x, W, b = r(5, 8).requires_grad_(), r(3, 8).requires_grad_(), r(3).requires_grad_()
    y = F.linear(x, W, b)
    dy = r(5, 3)
    y.backward(dy)
    rec.update({"linear.x": np64(x), "linear.W": np64(W), "linear.b": np64(b), "linear.y": np64(y),
                "linear.dy": np64(dy), "linear.dx": np64(x.grad), "linear.dW": np64(W.grad),
                "linear.db": np64(b.grad)})
    # cross-entropy (mean) and its gradient; accuracy by first argmax
    z = (r(6, 10) * 3).requires_grad_()
    lab = torch.tensor([0, 3, 9, 3, 5, 1])
    loss = F.cross_entropy(z, lab)
    loss.backward()
    rec.update({"xent.z": np64(z), "xent.labels": lab.numpy().astype(np.int32), "xent.loss": np64(loss).reshape(1),
                "xent.dz": np64(z.grad),
                "xent.correct": np.array([(z.argmax(1) == lab).sum().item()], np.int32)})
    fixtures.write(os.path.join(OUT, "layers.bin"), rec)


def flat(tensors):
    # float32 keeps the committed file small; the C side compares float32 results at 1e-4 anyway
    return (np.concatenate([np64(t).ravel() for t in tensors]) if tensors else np.zeros(0)).astype(np.float32)


def tiny_steps():
    rec = {}
    for norm in (True, False):
        tag = "bn" if norm else "none"
        torch.manual_seed(7)
        model = ResNet("tiny", norm=norm)
        params = [p for _, p in model.named_parameters()]
        bufs = [b for n, b in model.named_buffers() if not n.endswith("num_batches_tracked")]
        g = torch.Generator().manual_seed(99)
        x = torch.randn(8, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (8,), generator=g)
        rec.update({f"{tag}.params0": flat(params), f"{tag}.buffers0": flat(bufs), f"{tag}.x": np64(x).astype(np.float32),
                    f"{tag}.y": y.numpy().astype(np.int32)})
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        losses = []
        for step in range(2):
            opt.zero_grad()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            if step == 0:
                rec[f"{tag}.logits0"] = np64(logits).astype(np.float32)
                rec[f"{tag}.grads0"] = flat([p.grad for p in params])
            opt.step()
            losses.append(loss.item())
        rec[f"{tag}.losses"] = np.array(losses)
        rec[f"{tag}.params2"] = flat(params)
        rec[f"{tag}.buffers2"] = flat(bufs)
    fixtures.write(os.path.join(OUT, "tiny.bin"), rec)


def resnet18_names():
    model = ResNet("resnet18", norm=True)
    text = ";".join(f"{n}:{'x'.join(map(str, p.shape))}" for n, p in model.named_parameters())
    fixtures.write(os.path.join(OUT, "resnet18.bin"), {
        "names": np.frombuffer(text.encode(), np.uint8).astype(np.int32),
        "count": np.array([sum(p.numel() for p in model.parameters())], np.int64)})


def rng():
    rec = {}
    for n in (1, 2, 7, 10, 100, 1000, 50000):
        for seed in ((0, 1, 42, 12345, 2**32 - 1) if n < 50000 else (0, 2**32 - 1)):
            g = torch.Generator().manual_seed(seed)
            rec[f"randperm_n{n}_s{seed}"] = torch.randperm(n, generator=g).numpy().astype(np.int32)
    fixtures.write(os.path.join(OUT, "rng.bin"), rec)


def sampler():
    rec = {}
    for N in (1, 3, 10, 17, 100, 509):
        for R in (1, 2, 3, 4, 8):
            for seed in (0, 7):
                for epoch in (0, 3):
                    for dl in (0, 1):
                        for sh in (0, 1):
                            for r in range(R):
                                s = DistributedSampler(range(N), num_replicas=R, rank=r, shuffle=bool(sh),
                                                       seed=seed, drop_last=bool(dl))
                                s.set_epoch(epoch)
                                rec[f"sampler_N{N}_R{R}_s{seed}_e{epoch}_dl{dl}_sh{sh}_r{r}"] = \
                                    np.array(list(iter(s)), np.int32)
    fixtures.write(os.path.join(OUT, "sampler.bin"), rec)


if __name__ == "__main__":
    layers()
    tiny_steps()
    resnet18_names()
    rng()
    sampler()
    print("fixtures written to", os.path.abspath(OUT), "with torch", torch.__version__)
    for f in sorted(os.listdir(OUT)):
        print(f"  {f:14s} {os.path.getsize(os.path.join(OUT, f)):9d} bytes")
