"""bench_ddp_unused.py — what find_unused_parameters costs PyTorch's DDP, the baseline of
tests/bench_unused.sh (stage 3 with --find-unused-parameters / --unused-param).

    torchrun --nproc-per-node 2 tests/torch/bench_ddp_unused.py [--find-unused-parameters] [--unused-param]

bench_ddp.py's setting (ResNet-18, batch 128 per GPU on the GPU already, SGD momentum 0.9, wd 5e-4,
DDP defaults, steps timed with CUDA events, median after warm-up), with two switches:
--unused-param adds `fc_unused = nn.Linear(512, 10)`, registered after every other parameter and
never called by forward (the model ./stage3 --unused-param builds); --find-unused-parameters passes
find_unused_parameters=True. Rank 0 prints one JSON line like bench_ddp.py's.
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from models import ResNet
from timing import time_sgd_steps


class WithUnused(ResNet):
    def __init__(self, arch):
        super().__init__(arch)
        self.fc_unused = nn.Linear(self.linear.in_features, self.linear.out_features)  # never called


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=128, help="per GPU")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--find-unused-parameters", action="store_true")
    ap.add_argument("--unused-param", action="store_true")
    args = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    net = (WithUnused if args.unused_param else ResNet)(args.model).to(dev)
    model = DDP(net, device_ids=[dev.index], find_unused_parameters=args.find_unused_parameters)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator(device=dev).manual_seed(1000 + rank)
    x = torch.randn(args.batch, 3, 32, 32, device=dev, generator=gen)
    y = torch.randint(0, 10, (args.batch,), device=dev, generator=gen)
    try:
        med, loss = time_sgd_steps(model, opt, x, y, args.warmup, args.steps)
    except RuntimeError as e:  # --unused-param without --find-unused-parameters: the second step raises
        if rank == 0:
            print(json.dumps({"type": "error", "who": "pytorch_ddp", "error": str(e).splitlines()[0]}), flush=True)
        dist.destroy_process_group()
        raise SystemExit(2)
    if rank == 0:
        print(json.dumps({"type": "summary", "who": "pytorch_ddp", "backend": args.backend, "world_size": world,
                          "model": args.model, "batch_size": args.batch,
                          "find_unused_parameters": args.find_unused_parameters, "unused_param": args.unused_param,
                          "ms_per_iter_median": med, "img_per_s": 1000.0 * world * args.batch / med,
                          "torch": torch.__version__, "loss": loss}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
