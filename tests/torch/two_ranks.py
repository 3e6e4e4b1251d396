"""two_ranks.py — the text fixtures that need two DDP ranks (ddp_nosync_fixture.py,
ddp_unused_fixture.py): run target(rank, world, port, queue) in two spawned processes (gloo on the
CPU), take the lines rank 0 puts on the queue, and write them under a header for the C tests."""
import os
import sys

import torch.multiprocessing as mp


def collect(target, world=2):
    """Rank 0's lines; a rank that fails ends the wait at once (not after a timeout)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29000 + os.getpid() % 1000
    procs = [ctx.Process(target=target, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    lines = None
    while lines is None:
        try:
            lines = queue.get(timeout=1)
        except Exception:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                sys.exit("a rank process failed")
    for p in procs:
        p.join()
        if p.exitcode:
            sys.exit(f"rank process failed with exit code {p.exitcode}")
    return lines


def write(out, header, lines):
    """header: the '# …' lines (without newlines); then one line per entry of lines."""
    with open(out, "w") as f:
        for h in header:
            f.write(h + "\n")
        for line in lines:
            f.write(line + "\n")
    print(open(out).read(), end="")
