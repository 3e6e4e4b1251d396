"""ddp_post_forward.py — after which forwards PyTorch's DDP broadcasts the buffers, by default (PRE_FORWARD)
and with the buffer hook at POST_FORWARD (_register_buffer_comm_hook), under no_sync and around an evaluation.

    python3 tests/torch/ddp_post_forward.py      (2 processes, gloo, on the CPU; prints two lines)

Six training forwards in groups of K = 3 (n: inside no_sync, S: synchronised), two evaluation forwards
(e), two more synchronised ones. Each line lists the forwards a broadcast was issued at, and whether both
ranks' running means were equal as each forward began. Backs stages/stage3_ddp/README.md's
--broadcast-buffers after-forward paragraph (docs/logs/ddp_post_forward_torch_cpu_2026-12-07.txt).
"""
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.parallel.distributed import _BufferCommHookLocation as Loc


def run(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for where in ("pre", "post"):
        torch.manual_seed(0)
        m = DDP(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
        log, tag, same = [], [None], []

        def check(mod, args):
            v = mod[1].running_mean.clone()
            o = [torch.empty_like(v) for _ in range(2)]
            dist.all_gather(o, v)
            same.append((tag[0], bool(torch.equal(o[0], o[1]))))

        m.module.register_forward_pre_hook(check)
        real = dist._broadcast_coalesced
        if where == "post":
            def hook(state, bufs):
                log.append(tag[0])
                return [dist.broadcast(b, 0, async_op=True).get_future() for b in bufs.values()]
            m._register_buffer_comm_hook(None, hook, comm_hook_location=Loc.POST_FORWARD)
        else:
            def counting(*a, **k):
                log.append(tag[0])
                return real(*a, **k)
            dist._broadcast_coalesced = counting
        g = torch.Generator().manual_seed(rank)  # each rank its own data: their statistics differ
        for i in range(6):
            s = (i + 1) % 3 == 0
            tag[0] = "t%d%s" % (i, "S" if s else "n")
            with nullcontext() if s else m.no_sync():
                m(torch.randn(8, 4, generator=g)).sum().backward()
        m.eval()
        with torch.no_grad():
            for j in range(2):
                tag[0] = "e%d" % j
                m(torch.randn(8, 4, generator=g))
        m.train()
        for i in (6, 7):
            tag[0] = "t%dS" % i
            m(torch.randn(8, 4, generator=g)).sum().backward()
        dist._broadcast_coalesced = real
        if rank == 0:
            print(torch.__version__, where, "broadcast at:", log, "\n  buffers equal as each forward began:", same,
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
