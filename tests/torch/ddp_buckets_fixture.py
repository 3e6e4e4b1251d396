"""ddp_buckets_fixture.py — the gradient buckets PyTorch's DDP builds for ResNet-18, per bucket_cap_mb.

    python3 tests/torch/ddp_buckets_fixture.py [OUT]     (default: tests/fixtures/ddp_buckets.txt)

Wraps the ResNet-18 twin (models.py) in torch.nn.parallel.DistributedDataParallel (gloo, one process
on the CPU: the reducer's bucketing is the same C++ whatever the backend and world size) and runs
three training steps. A communication hook records each bucket's size (bucket.buffer().numel(), in
floats) in bucket-index order, every step. Cases:

  - find_unused_parameters=False, bucket_cap_mb left out / 25 / 4 / 1000: step 1 runs one bucket of
    everything; the buckets are rebuilt before step 2, in the order the gradients became ready, the
    first capped at 1 MiB only when bucket_cap_mb was left out (else at bucket_cap_mb);
  - find_unused_parameters=True, bucket_cap_mb left out / 4: never rebuilt; the buckets are cut in
    forward (registration) order — the first capped at 1 MiB when bucket_cap_mb was left out — and
    the list reversed, so the small bucket of the first layers is all-reduced last;
  - DDP_SET_LAST_BUCKET_CAP=1 in the environment (bucket_cap_mb left out): the rebuild cuts the
    reversed gradient-ready order and reverses the result, so the 1 MiB bucket is the last one —
    PyTorch's nearest thing to ./stage3 --last-bucket-mb 1 (whose other buckets are cut from the front).

One line per case and step: `case=NAME step=S buckets=F1,F2,...` (floats). tests/test_ddp.c plans the
same cases with ddp.c and compares. Text, so no numpy is needed to make or read it.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ResNet  # noqa: E402

STEPS, BATCH = 3, 4
CASES = [  # name, find_unused_parameters, bucket_cap_mb (None: left out)
    ("default", False, None),
    ("cap25", False, 25),
    ("cap4", False, 4),
    ("cap1000", False, 1000),
    ("unused_default", True, None),
    ("unused_cap4", True, 4),
    ("last_cap", False, None),  # with DDP_SET_LAST_BUCKET_CAP=1: the 1 MiB bucket comes last instead
]


def run(find_unused, cap):
    torch.manual_seed(0)
    model = ResNet("resnet18")
    kw = {} if cap is None else {"bucket_cap_mb": cap}
    ddp = DDP(model, find_unused_parameters=find_unused, **kw)
    sizes = []

    def hook(state, bucket):
        sizes[-1].append((bucket.index(), bucket.buffer().numel()))
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
    for _ in range(STEPS):
        sizes.append([])
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    return [[n for _, n in sorted(step)] for step in sizes]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures",
                                                               "ddp_buckets.txt")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29000 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    lines = []
    for name, find_unused, cap in CASES:
        if name == "last_cap":
            os.environ["DDP_SET_LAST_BUCKET_CAP"] = "1"  # read by Reducer::rebuild_buckets
        for s, step in enumerate(run(find_unused, cap)):
            lines.append(f"case={name} step={s + 1} buckets={','.join(map(str, step))}")
            print(lines[-1], f"({', '.join(f'{4 * n / 2**20:.2f}' for n in step)} MiB)", flush=True)
    dist.destroy_process_group()
    with open(out, "w") as f:
        f.write(f"# DDP's gradient buckets for ResNet-18 (models.py), observed in torch {torch.__version__} "
                "(gloo, 1 rank, 3 steps).\n")
        f.write("# Made by tests/torch/ddp_buckets_fixture.py; read by tests/test_ddp.c. Floats per bucket, in "
                "bucket-index order.\n")
        for line in lines:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
