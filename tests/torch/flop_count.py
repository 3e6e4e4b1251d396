"""flop_count.py — PyTorch's own count of the FLOPs of one training step: tests/fixtures/flops.txt.

    python3 tests/torch/flop_count.py [OUT]        (CPU is enough; default tests/fixtures/flops.txt)

torch.utils.flop_counter.FlopCounterMode counts 2 FLOPs per multiply-add of every convolution and
matrix product (nothing for batch norm, ReLU, add or pooling), separately for the forward and for
the backward of the hand-written CIFAR ResNets in models.py (the twins of common/model.c) — the
convention of model_flops() in common/model.h. The backward counts what autograd really computes:
the input batch needs no gradient, so the first convolution's data gradient is not there.
Per image, for both architectures and both --norm settings (batch norm adds no FLOPs in this
convention, so the two must agree). tests/test_flops.c checks model_flops() against every line.
"""
import os
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ResNet  # noqa: E402

BATCH = 4  # FLOPs are linear in the batch: the file holds BATCH's counts divided by BATCH


def count(arch, norm):
    torch.manual_seed(0)
    model = ResNet(arch, norm=norm)
    x = torch.randn(BATCH, 3, 32, 32)  # the batch: requires_grad False, as in training
    y = torch.randint(0, 10, (BATCH,))
    with FlopCounterMode(display=False) as fwd:
        loss = torch.nn.functional.cross_entropy(model(x), y)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    f, b = fwd.get_total_flops(), bwd.get_total_flops()
    assert f % BATCH == 0 and b % BATCH == 0, (f, b)
    return f // BATCH, b // BATCH


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                              "..", "fixtures", "flops.txt")
    lines = [f"# FLOPs per image of one training step, counted by torch {torch.__version__} "
             "torch.utils.flop_counter.FlopCounterMode (2 per multiply-add; conv and matmul only).",
             "# Made by tests/torch/flop_count.py; read by tests/test_flops.c. arch norm forward backward"]
    for arch in ("tiny", "resnet18"):
        for norm in (True, False):
            f, b = count(arch, norm)
            lines.append(f"{arch} {'bn' if norm else 'none'} {f} {b}")
    with open(out, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
