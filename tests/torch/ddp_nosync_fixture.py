"""ddp_nosync_fixture.py — what PyTorch's DDP communicates under gradient accumulation, counted.

    python3 tests/torch/ddp_nosync_fixture.py [OUT]     (default: tests/fixtures/ddp_nosync.txt)

Runs torch.nn.parallel.DistributedDataParallel (gloo, 2 processes on the CPU; the decisions below are
the same Python code on CUDA) over the tiny ResNet with batch norm (models.py), the stage 4 loop:

    for i, (x, y) in enumerate(loader):                      # 7 micro-batches per epoch, 2 epochs
        last = (i + 1) % K == 0 or i + 1 == len(loader)
        with (nullcontext() if last else ddp_model.no_sync()):   # sync_each: never no_sync
            (F.cross_entropy(ddp_model(x), y) / K).backward()
        if last: optimizer.step(); optimizer.zero_grad()
    evaluate: ddp_model.eval(), 2 batches under torch.no_grad(), through the DDP module

and counts, per optimizer step and per evaluation, the buffer broadcasts DDP issues
(dist._broadcast_coalesced of the BN running statistics, broadcast_buffers=True; decided by
require_forward_param_sync in _pre_forward / _post_forward) and the gradient all-reduces
(calls of a comm hook that does what the default one does; the tiny model is one bucket). Each
forward also checks that the count is what happened: when a broadcast was counted, every rank's
inner forward starts from the same (rank 0's) running statistics; when none was, from its own,
untouched ones (the ranks see different data, so their statistics differ).

The C test (tests/test_accum.c) runs ./stage4 over the same schedule and compares its counts with
this file's. Written as text, one line per (mode, K): no numpy needed to make or read it.
"""
import os
import sys
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ResNet  # noqa: E402
import two_ranks  # noqa: E402

MICRO, EPOCHS, EVAL_BATCHES, BATCH = 7, 2, 2, 4
KS = (1, 2, 3, 4)


def bn_buffers(model):
    return torch.cat([b.detach().flatten().clone() for n, b in model.named_buffers() if "running" in n])


def checked_forward(model, x, counts):
    """model(x), checking that a counted broadcast is what happened to the buffers: the statistics the
    inner module's forward starts from are rank 0's on every rank when one was counted, and this
    rank's own, untouched, when none was."""
    before, n0, seen = bn_buffers(model.module), counts["bcast"], []
    handle = model.module.register_forward_pre_hook(lambda mod, args: seen.append(bn_buffers(mod)))
    out = model(x)
    handle.remove()
    everyone = [torch.empty_like(seen[0]) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, seen[0])  # not a _broadcast_coalesced: not counted
    if counts["bcast"] > n0:
        assert all(torch.equal(e, everyone[0]) for e in everyone), "counted a broadcast, buffers differ"
    else:
        assert torch.equal(seen[0], before), "buffers changed without a counted broadcast"
    return out


def run(rank, world, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data, so BN stats differ
    data = [(torch.randn(BATCH, 3, 32, 32, generator=gen), torch.randint(0, 10, (BATCH,), generator=gen))
            for _ in range(MICRO)]
    lines = []
    for mode in ("no_sync", "sync_each"):
        for K in KS:
            torch.manual_seed(0)
            model = DDP(ResNet("tiny", norm=True))  # the constructor's broadcast is not counted
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            counts = {"bcast": 0, "allreduce": 0}
            real = dist._broadcast_coalesced

            def counting(*args, **kwargs):
                counts["bcast"] += 1
                return real(*args, **kwargs)

            def hook(state, bucket):
                counts["allreduce"] += 1
                return default_hooks.allreduce_hook(state, bucket)

            dist._broadcast_coalesced = counting
            model.register_comm_hook(dist.group.WORLD, hook)
            steps, evals = [], []
            try:
                for epoch in range(EPOCHS):
                    model.train()
                    start = dict(counts)
                    for i, (x, y) in enumerate(data):
                        last = (i + 1) % K == 0 or i + 1 == len(data)
                        with (nullcontext() if last or mode == "sync_each" else model.no_sync()):
                            out = checked_forward(model, x, counts)
                            (F.cross_entropy(out, y) / K).backward()
                        if last:
                            opt.step()
                            opt.zero_grad()
                            steps.append((counts["bcast"] - start["bcast"], counts["allreduce"] - start["allreduce"]))
                            start = dict(counts)
                    model.eval()
                    e0 = counts["bcast"]
                    with torch.no_grad():
                        for x, _ in data[:EVAL_BATCHES]:
                            checked_forward(model, x, counts)
                    evals.append(counts["bcast"] - e0)
            finally:
                dist._broadcast_coalesced = real
            lines.append(f"mode={mode} K={K} micro={MICRO} epochs={EPOCHS} eval_batches={EVAL_BATCHES} "
                         f"broadcasts={','.join(str(b) for b, _ in steps)} "
                         f"allreduces={','.join(str(a) for _, a in steps)} "
                         f"eval_broadcasts={','.join(str(e) for e in evals)}")
    if rank == 0:
        queue.put(lines)
    dist.destroy_process_group()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures",
                                                             "ddp_nosync.txt")
    lines = two_ranks.collect(run)
    two_ranks.write(out, [
        f"# DDP's communication per optimizer step under gradient accumulation, counted in torch "
        f"{torch.__version__.split('+')[0]} (gloo, 2 ranks, tiny ResNet with BN).",
        "# Made by tests/torch/ddp_nosync_fixture.py; read by tests/test_accum.c. One line per mode and K:",
        "# broadcasts / allreduces: per optimizer step (both epochs, in order); eval_broadcasts: per evaluation.",
    ], lines)


if __name__ == "__main__":
    main()
