"""ddp_unused_fixture.py — what PyTorch's DDP does with a parameter the forward never uses.

    python3 tests/torch/ddp_unused_fixture.py [OUT]     (default: tests/fixtures/ddp_unused.txt)

Runs torch.nn.parallel.DistributedDataParallel (gloo, 2 processes on the CPU; the reducer is the same
C++ on CUDA) over the tiny ResNet without batch norm (models.py) plus a second head the forward never
calls — the model `--unused-param` builds:

    class Net(ResNet):                       # parameters 0-8 as in models.py, then
        fc_unused = nn.Linear(64, 10)         # 9: fc_unused.weight, 10: fc_unused.bias

    for step in range(STEPS):                # SGD(lr=0.05, momentum=0.9, weight_decay=5e-4)
        loss = F.cross_entropy(ddp_model(x), y); loss.backward(); opt.step(); opt.zero_grad()

and records, one `key=value` line each:
  - find_unused_parameters=False: which forward raises (the start of step 2), the error's first
    sentence, the parameter indices and names it lists (names with TORCH_DISTRIBUTED_DEBUG=INFO), how
    many gradient all-reduces step 1 ran (none: the one bucket holds fc_unused and never became
    ready, so the optimizer stepped on unaveraged gradients), and that a 1-step run ends cleanly;
  - find_unused_parameters=True: all-reduces per step (the bucket, then the used-parameter map), the
    bucket's size in floats (fc_unused included), fc_unused's .grad after backward (None: it keeps
    no gradient, so the optimizer skips it), whether fc_unused changed, whether the buckets were
    rebuilt after step 1 (never, with find_unused_parameters) — and, for contrast, the same model
    without the extra head under find_unused_parameters=False (rebuilt) and =True (the warning).

The C test (tests/test_ddp.c) runs ./stage3 --unused-param [--find-unused-parameters] and compares.
Text, so no numpy is needed to make or read it.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ResNet  # noqa: E402
import two_ranks  # noqa: E402

STEPS, BATCH = 3, 8


class Net(ResNet):
    def __init__(self, unused=True):
        super().__init__("tiny", norm=False)
        if unused:
            self.fc_unused = nn.Linear(64, 10)  # registered last, never called by forward


def allreduces(fn):
    """fn() under the profiler: how many gloo all-reduces it ran (buckets and the used-parameter map)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name == "gloo:all_reduce")


def train(rank, find, unused, steps, out):
    torch.manual_seed(0)
    model = DDP(Net(unused), find_unused_parameters=find)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    bucket_floats, per_step = [], []

    def hook(state, bucket):
        bucket_floats.append(bucket.buffer().numel())
        return default_hooks.allreduce_hook(state, bucket)

    model.register_comm_hook(dist.group.WORLD, hook)
    gen = torch.Generator().manual_seed(100 + rank)
    w0 = model.module.fc_unused.weight.detach().clone() if unused else None
    for step in range(1, steps + 1):
        x, y = torch.randn(BATCH, 3, 32, 32, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen)
        try:
            output = model(x)
        except RuntimeError as e:
            out["raised_at_forward"] = step
            out["message"] = str(e)
            return
        n = allreduces(lambda: F.cross_entropy(output, y).backward())
        per_step.append(n)
        if unused:
            out["unused_grad_none"] = int(model.module.fc_unused.weight.grad is None)
        opt.step()
        opt.zero_grad()
    out["allreduces_per_step"] = ",".join(map(str, per_step))
    out["bucket_floats"] = bucket_floats[-1] if bucket_floats else 0
    out["rebuilt"] = int(model._get_ddp_logging_data().get("has_rebuilt_buckets", 0))
    if unused:
        out["unused_changed"] = int(not torch.equal(w0, model.module.fc_unused.weight))


def run(rank, world, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    lines = []
    err = {}
    train(rank, False, True, STEPS, err)
    msg = err["message"]
    first = msg.split(". ")[0].strip() + "."
    idx = [l for l in msg.splitlines() if l.startswith("Parameter indices which did not receive grad")][0]
    names = [l for l in msg.splitlines() if l.startswith("Parameters which did not receive grad")][0]
    lines.append(f"find_unused=0 steps={STEPS} raised_at_forward={err['raised_at_forward']}")
    lines.append(f"find_unused=0 first_sentence={first}")
    lines.append(f"find_unused=0 unused_indices={idx.split(':')[1].strip()}")
    lines.append(f"find_unused=0 unused_names={','.join(sorted(n.strip() for n in names.split(':')[1].split(',')))}")
    one = {}
    train(rank, False, True, 1, one)
    lines.append(f"find_unused=0 steps=1 raised={int('message' in one)} allreduces_per_step={one['allreduces_per_step']}")
    dist.barrier()
    ok = {}
    train(rank, True, True, STEPS, ok)
    lines.append(f"find_unused=1 steps={STEPS} allreduces_per_step={ok['allreduces_per_step']} "
                 f"bucket_floats={ok['bucket_floats']} unused_grad_none={ok['unused_grad_none']} "
                 f"unused_changed={ok['unused_changed']} rebuilt={ok['rebuilt']}")
    plain = {}
    train(rank, False, False, STEPS, plain)
    lines.append(f"no_unused find_unused=0 steps={STEPS} allreduces_per_step={plain['allreduces_per_step']} "
                 f"rebuilt={plain['rebuilt']}")
    plain = {}
    train(rank, True, False, STEPS, plain)  # warns on stderr: "...did not find any unused parameters..."
    lines.append(f"no_unused find_unused=1 steps={STEPS} allreduces_per_step={plain['allreduces_per_step']} "
                 f"rebuilt={plain['rebuilt']}")
    if rank == 0:
        queue.put(lines)
    dist.destroy_process_group()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures",
                                                             "ddp_unused.txt")
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "INFO"  # read when torch loads: the error then names parameters
    lines = two_ranks.collect(run)
    two_ranks.write(out, [
        f"# DDP and a parameter the forward never uses, observed in torch {torch.__version__.split('+')[0]} "
        f"(gloo, 2 ranks, tiny ResNet without BN + fc_unused).",
        "# Made by tests/torch/ddp_unused_fixture.py; read by tests/test_ddp.c.",
    ], lines)


if __name__ == "__main__":
    main()
