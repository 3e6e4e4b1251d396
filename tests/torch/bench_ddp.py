"""bench_ddp.py — the PyTorch DistributedDataParallel baseline that stage 3 is compared against.

    torchrun --nproc-per-node 2 tests/torch/bench_ddp.py --model resnet18 --batch 128 --steps 300
    torchrun --nproc-per-node 2 tests/torch/bench_ddp.py --backend gloo     # two processes on one GPU

Same model (models.py) and optimizer as bench_pytorch.py: synthetic data already on each GPU, batch
128 per GPU, SGD with momentum 0.9 and weight decay 5e-4, cudnn.benchmark on, fp32 with PyTorch's
default TF32 policy for convolutions, DDP with its defaults (bucket_cap_mb 25, broadcast_buffers,
gradients copied into buckets). Each step is timed with CUDA events at step starts (as the C stages
do); the median over the steps after warm-up is rank 0's. Rank 0 prints one JSON line:
ms_per_iter_median, img_per_s (all ranks together), peak_mem_bytes (one entry per rank).
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from models import ResNet
from timing import time_sgd_steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=128, help="per GPU")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    args = ap.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = DDP(ResNet(args.model).to(dev), device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator(device=dev).manual_seed(1000 + rank)  # each rank its own batch
    x = torch.randn(args.batch, 3, 32, 32, device=dev, generator=gen)
    y = torch.randint(0, 10, (args.batch,), device=dev, generator=gen)
    torch.cuda.reset_peak_memory_stats(dev)
    med, loss = time_sgd_steps(model, opt, x, y, args.warmup, args.steps)
    peaks = [None] * world
    dist.all_gather_object(peaks, torch.cuda.max_memory_allocated(dev))
    if rank == 0:
        print(json.dumps({"type": "summary", "who": "pytorch_ddp", "backend": args.backend, "world_size": world,
                          "model": args.model, "batch_size": args.batch, "ms_per_iter_median": med,
                          "img_per_s": 1000.0 * world * args.batch / med, "peak_mem_bytes": peaks,
                          "torch": torch.__version__, "loss": loss}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
