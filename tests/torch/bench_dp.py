"""bench_dp.py — PyTorch's own numbers for the stage 2 table: one GPU against nn.DataParallel.

    python3 tests/torch/bench_dp.py --models resnet18,tiny --batch 128 --steps 60 [--optimizer adam]

For each model: a plain single-GPU training step at --batch, then nn.DataParallel over GPUs 0 and 1
at 2 × --batch (--batch per GPU, as ./stage2's --batch-size). Same model as the stages (models.py),
synthetic data already on GPU0, SGD(momentum 0.9, weight decay 5e-4) or with --optimizer adam
Adam(lr 1e-3, weight decay 5e-4) — its two state buffers on GPU0, where the parameters live —, fp32 with PyTorch's default
TF32 policy for convolutions, cudnn.benchmark off (as the stage runs of tests/bench_stage2.sh).
Step time: CUDA events on GPU0's current stream at step starts, median after --warmup steps (as the
C stages time it). Peak memory: torch.cuda.max_memory_allocated per GPU. One JSON line per run.
With one GPU the DataParallel run is skipped: it needs two devices, and PyTorch's broadcast refuses
(or NCCL hangs on) the same GPU twice.
"""
import argparse
import json

import torch
import torch.nn as nn

from models import ResNet
from timing import time_sgd_steps


def run(arch, devices, batch, steps, warmup, optimizer):
    torch.manual_seed(0)
    model = ResNet(arch).cuda(devices[0])
    if len(devices) > 1:
        model = nn.DataParallel(model, device_ids=devices)
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=5e-4)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    n = batch * len(devices)
    x = torch.randn(n, 3, 32, 32, device=f"cuda:{devices[0]}")
    y = torch.randint(0, 10, (n,), device=f"cuda:{devices[0]}")
    for d in devices:
        torch.cuda.synchronize(d)
        torch.cuda.reset_peak_memory_stats(d)
    with torch.cuda.device(devices[0]):
        med, loss = time_sgd_steps(model, opt, x, y, warmup, steps,
                                   sync=lambda: [torch.cuda.synchronize(d) for d in devices])
    return {"type": "summary", "who": "pytorch", "mode": "dp" if len(devices) > 1 else "single",
            "model": arch, "gpus": len(devices), "batch_size": batch, "optimizer": optimizer, "ms_per_iter_median": med,
            "img_per_s": 1000.0 * n / med,
            "peak_mem_bytes": [torch.cuda.max_memory_allocated(d) for d in devices],
            "torch": torch.__version__, "loss": loss}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,tiny")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = False
    ngpu = torch.cuda.device_count()
    for arch in args.models.split(","):
        print(json.dumps(run(arch, [0], args.batch, args.steps, args.warmup, args.optimizer)), flush=True)
        if ngpu >= 2:
            print(json.dumps(run(arch, [0, 1], args.batch, args.steps, args.warmup, args.optimizer)), flush=True)
        else:
            print(json.dumps({"type": "skipped", "who": "pytorch", "mode": "dp", "model": arch,
                              "why": "nn.DataParallel needs 2 GPUs"}), flush=True)


if __name__ == "__main__":
    main()
