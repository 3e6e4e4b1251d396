"""autocast_dtypes.py — which dtype each op of a ResNet block produces under torch.autocast.

    python3 tests/torch/autocast_dtypes.py [--device cuda|cpu] [--dtype fp16|bf16]

Runs conv -> bn -> relu -> conv -> bn -> (+ shortcut conv -> bn) -> add -> relu -> pool -> linear ->
cross_entropy on a small batch under torch.autocast and prints, for every op, the dtype of its
output and of its gradient with respect to its input, and the dtype of the parameter gradients.
That table is the one in stages/stage5_amp/README.md (stage 5 follows PyTorch's CUDA autocast).
Without --device: cuda when available, else cpu (CPU autocast only knows bf16).
"""
import argparse

import torch
import torch.nn.functional as F

from models import BasicBlock


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["fp16", "bf16"])
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtypes = [args.dtype] if args.dtype else (["fp16", "bf16"] if dev.type == "cuda" else ["bf16"])
    for name in dtypes:
        dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
        torch.manual_seed(0)
        stem = torch.nn.Conv2d(3, 16, 3, 1, 1, bias=False).to(dev)
        bn = torch.nn.BatchNorm2d(16).to(dev)
        block = BasicBlock(16, 32, 2, True).to(dev)
        head = torch.nn.Linear(32, 10).to(dev)
        x = torch.randn(4, 3, 8, 8, device=dev)
        y = torch.randint(0, 10, (4,), device=dev)
        rows = []

        def track(op, t):
            t.retain_grad()
            rows.append((op, t))
            return t

        with torch.autocast(device_type=dev.type, dtype=dt):
            h = track("conv2d (stem)", stem(x))
            h = track("batch_norm", bn(h))
            h = track("relu", F.relu(h))
            a = track("conv2d (block.conv1)", block.conv1(h))
            a = track("batch_norm (block.bn1)", block.bn1(a))
            a = track("relu (block)", F.relu(a))
            a = track("conv2d (block.conv2)", block.conv2(a))
            a = track("batch_norm (block.bn2)", block.bn2(a))
            s = track("conv2d (shortcut)", block.shortcut[0](h))
            s = track("batch_norm (shortcut)", block.shortcut[1](s))
            o = track("add (residual)", a + s)
            o = track("relu (after add)", F.relu(o))
            p = track("adaptive_avg_pool2d", F.adaptive_avg_pool2d(o, 1).flatten(1))
            z = track("linear", head(p))
            loss = F.cross_entropy(z, y)
        loss.backward()
        print(f"torch {torch.__version__}, autocast(device_type={dev.type!r}, dtype={dt})")
        print(f"  {'op':28s} {'output':16s} {'grad of output':16s}")
        for op, t in rows:
            print(f"  {op:28s} {str(t.dtype):16s} {str(t.grad.dtype):16s}")
        print(f"  {'cross_entropy (loss)':28s} {str(loss.dtype):16s}")
        for n, prm in [("conv weight", stem.weight), ("bn weight", bn.weight), ("bn running_mean", bn.running_mean),
                       ("linear weight", head.weight), ("linear bias", head.bias)]:
            g = prm.grad.dtype if prm.grad is not None else "-"
            print(f"  param {n:22s} {str(prm.dtype):16s} grad {g}")
        print()


if __name__ == "__main__":
    main()
