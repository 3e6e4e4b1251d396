"""bench_ddp.py — the PyTorch DistributedDataParallel baseline that stages 3 and 4 are compared against.

    torchrun --nproc-per-node 2 tests/torch/bench_ddp.py --model resnet18 --batch 128 --steps 300
    torchrun --nproc-per-node 2 tests/torch/bench_ddp.py --backend gloo     # two processes on one GPU
    torchrun --nproc-per-node 2 tests/torch/bench_ddp.py --accum-steps 4    # gradient accumulation (stage 4)

Same model (models.py) and optimizer as bench_pytorch.py: synthetic data already on each GPU, batch
128 per GPU, SGD with momentum 0.9 and weight decay 5e-4, cudnn.benchmark on (--cudnn-benchmark off: off), fp32 with PyTorch's
default TF32 policy for convolutions, DDP with its defaults (bucket_cap_mb 25, broadcast_buffers,
gradients copied into buckets). Each step is timed with CUDA events at step starts (as the C stages
do); the median over the steps after warm-up is rank 0's. Rank 0 prints one JSON line:
ms_per_iter_median, img_per_s (all ranks together), peak_mem_bytes (one entry per rank).

--accum-steps K > 1 times optimizer steps of K micro-batches of --batch each, the idiom of
stages/stage4_grad_accum: the first K−1 forward/backward passes inside ddp_model.no_sync(), each loss
divided by K, then optimizer.step() and zero_grad(); img_per_s then counts K × batch × world images
per step. --sync-each-micro-step leaves no_sync out (every backward all-reduces: the experiment).
--sync-bn converts the model with nn.SyncBatchNorm.convert_sync_batchnorm before DDP (stage 3's
--sync-bn): the price of batch-norm statistics over every rank's batch.
"""
import argparse
import json
import os
import statistics
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from models import ResNet
from timing import time_sgd_steps


def time_accum_steps(model, opt, xs, ys, warmup, steps, sync_each):
    """Optimizer steps of len(xs) micro-batches, timed as timing.time_sgd_steps times its steps."""
    K, total = len(xs), warmup + steps
    events = [torch.cuda.Event(enable_timing=True) for _ in range(total + 1)]
    for i in range(total):
        events[i].record()
        for k in range(K):
            last = k == K - 1
            with (nullcontext() if last or sync_each else model.no_sync()):
                loss = F.cross_entropy(model(xs[k]), ys[k]) / K
                loss.backward()
        opt.step()
        opt.zero_grad()
    events[total].record()
    torch.cuda.synchronize()
    ms = [events[i].elapsed_time(events[i + 1]) for i in range(warmup, total)]
    return statistics.median(ms), loss.item() * K


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=128, help="per GPU")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--accum-steps", type=int, default=1, help="micro-batches per optimizer step (no_sync)")
    ap.add_argument("--sync-each-micro-step", action="store_true", help="accumulate without no_sync")
    ap.add_argument("--sync-bn", action="store_true", help="nn.SyncBatchNorm.convert_sync_batchnorm before DDP")
    ap.add_argument("--cudnn-benchmark", default="on", choices=["on", "off"],
                    help="torch.backends.cudnn.benchmark (make compare: off, as the stages' default)")
    args = ap.parse_args()
    if args.accum_steps < 1:
        ap.error("--accum-steps must be at least 1")

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
    torch.manual_seed(0)
    net = ResNet(args.model).to(dev)
    if args.sync_bn:
        net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)
    model = DDP(net, device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator(device=dev).manual_seed(1000 + rank)  # each rank its own batch
    K = args.accum_steps
    xs = [torch.randn(args.batch, 3, 32, 32, device=dev, generator=gen) for _ in range(K)]
    ys = [torch.randint(0, 10, (args.batch,), device=dev, generator=gen) for _ in range(K)]
    torch.cuda.reset_peak_memory_stats(dev)
    if K == 1 and not args.sync_each_micro_step:
        med, loss = time_sgd_steps(model, opt, xs[0], ys[0], args.warmup, args.steps)
    else:
        med, loss = time_accum_steps(model, opt, xs, ys, args.warmup, args.steps, args.sync_each_micro_step)
    peaks = [None] * world
    dist.all_gather_object(peaks, torch.cuda.max_memory_allocated(dev))
    if rank == 0:
        print(json.dumps({"type": "summary", "who": "pytorch_ddp", "backend": args.backend, "world_size": world,
                          "model": args.model, "batch_size": args.batch, "accum_steps": K,
                          "sync_each_micro_step": args.sync_each_micro_step, "sync_bn": args.sync_bn,
                          "cudnn_benchmark": args.cudnn_benchmark, "ms_per_iter_median": med,
                          "img_per_s": 1000.0 * world * args.batch * K / med, "peak_mem_bytes": peaks,
                          "torch": torch.__version__, "loss": loss}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
