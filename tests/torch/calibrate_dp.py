"""calibrate_dp.py — time the Python that nn.DataParallel runs every step, piece by piece, on this
machine, and print the ./stage2 flags that charge the same costs to stage 2's modelled GIL.

    python3 tests/torch/calibrate_dp.py [--model resnet18] [--repeat 200]

Stage 2 does not run Python; it charges interpreter time, holding its GIL model, where PyTorch's
DataParallel runs Python (stages/stage2_data_parallel/README.md). The charges are:
  --gil-op-us           per forward op, in each replica's thread: the serialized part of an eager
                        op's host cost (one thread alone vs two threads at once, as PyTorch's
                        threads run their forwards);
  --gil-host-module-us  replicate(): per module per replica (shallow copy, re-binding children);
  --gil-host-param-us   replicate(): per parameter or buffer per replica (re-binding, Broadcast
                        bookkeeping); also charged per gradient in reduce_add_coalesced;
  --gil-host-call-us    the fixed cost of one call of scatter / replicate / parallel_apply / gather /
                        reduce_add_coalesced (their mean);
  --gil-host-thread-us  parallel_apply(): per thread (Thread start-up and _worker's contexts);
  --gil-switch-ms       sys.getswitchinterval();
  --dp-plan-us          planning one forward convolution in a thread whose (thread_local) cuDNN
                        plan cache is empty, cudnn.benchmark off: a brand-new thread's first forward
                        minus a warm thread's forward, divided by the model's convolutions, at the
                        per-GPU batch (--batch). ./stage2 spends its own real cuDNN planning calls
                        first and charges only the rest up to this (common/plan_cache.c), so our
                        calls' cost is subtracted at run time;
  --dp-plan-bench-us    the same with cudnn.benchmark on (the new thread re-runs the search).
Every number is the median host wall time (time.perf_counter) of calls that only enqueue GPU work,
with all GPUs idle before each call, cudnn.benchmark off, autograd on (DataParallel trains).
Per-module and per-tensor costs are slopes between two sizes, so fixed costs cancel. The last line
is "flags: ..." (tests/bench_stage2.sh passes it to ./stage2).
"""
import argparse
import copy
import gc
import statistics
import sys
import threading
import time

import torch
import torch.cuda.comm as comm
import torch.nn as nn
from torch.nn.parallel import parallel_apply, replicate
from torch.nn.parallel.scatter_gather import gather, scatter_kwargs

from models import BasicBlock, ResNet

# ./stage2's defaults (common/dp_python.c, calibrated on 2x H200), used for any piece not measurable here
DEFAULTS = {"op": 24.24, "call": 40.6, "module": 14.04, "param": 11.92, "thread": 127.0,
            "plan": 983.0, "plan_bench": 26334.0}


def sync_all():
    for d in range(torch.cuda.device_count()):
        torch.cuda.synchronize(d)


def time_host(fn, repeat, warm=10):
    """Median host time of fn() in µs, every GPU idle before each call."""
    for _ in range(warm):
        fn()
    ts = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            sync_all()
            t0 = time.perf_counter()
            fn()  # its result is freed inside the timing, as DataParallel frees its replicas
            ts.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return 1e6 * statistics.median(ts)


def c_layer_count(model):
    """The ops of stage 2's layer list (common/model.c) for this PyTorch twin: conv, batch norm,
    ReLU (the stem's and two per block), the residual add, the pool and the linear layer."""
    mods = list(model.modules())
    convs = sum(isinstance(m, nn.Conv2d) for m in mods)
    bns = sum(isinstance(m, nn.BatchNorm2d) for m in mods)
    blocks = sum(isinstance(m, BasicBlock) for m in mods)
    return convs + bns + (1 + 2 * blocks) + blocks + 1 + 1


def per_op(arch, devs, repeat):
    """Per-op host cost of an eager forward from one thread, and the part of it that two threads
    running forwards at once cannot overlap (the GIL-serialized part)."""
    models = [ResNet(arch).cuda(d).train() for d in devs]
    xs = [torch.randn(2, 3, 32, 32, device=f"cuda:{d}") for d in devs]
    ops = c_layer_count(models[0])
    one = time_host(lambda: models[0](xs[0]), repeat)
    warm = 10
    barrier = threading.Barrier(3)
    ends = [[0.0] * (repeat + warm) for _ in devs]
    streams = [torch.cuda.Stream(device=d) for d in devs]

    def worker(i):
        try:
            with torch.cuda.device(devs[i]), torch.cuda.stream(streams[i]):
                for it in range(repeat + warm):
                    barrier.wait(timeout=60)
                    models[i](xs[i])
                    ends[i][it] = time.perf_counter()
                    barrier.wait(timeout=60)
        except Exception:
            barrier.abort()  # the main thread's wait raises instead of hanging
            raise

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    walls = []
    for it in range(repeat + warm):
        sync_all()
        t0 = time.perf_counter()
        barrier.wait(timeout=60)  # both threads start their forward
        barrier.wait(timeout=60)  # both are done issuing it
        if it >= warm:
            walls.append(max(ends[0][it], ends[1][it]) - t0)
    for t in threads:
        t.join()
    two = 1e6 * statistics.median(walls)
    # two threads: wall = one forward + the part of the other that could not overlap
    serialized = min(max((two - one) / ops, 0.0), one / ops)
    return ops, one / ops, two / ops, serialized


def plan_cost(arch, batch, benchmark, threads):
    """Per convolution: a brand-new thread's first forward minus a warm forward (wall clock, every
    GPU synchronised), median over `threads` new threads. Also the same difference for a model with
    no convolution at all (batch norm, ReLU, linear): the per-thread cost that is not planning."""
    torch.backends.cudnn.benchmark = benchmark
    try:
        out = {}
        conv_free = nn.Sequential(nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
        for name, model in (("resnet", ResNet(arch)), ("conv_free", conv_free)):
            model = model.cuda(0).train()
            x = torch.randn(batch, 3, 32, 32, device="cuda:0")

            def wall():
                sync_all()
                t0 = time.perf_counter()
                model(x)
                sync_all()
                return time.perf_counter() - t0
            for _ in range(3):
                wall()
            warm = statistics.median(wall() for _ in range(20))
            firsts = []
            for _ in range(threads):
                th = threading.Thread(target=lambda: firsts.append(wall()))
                th.start()
                th.join()
            out[name] = (1e6 * warm, 1e6 * statistics.median(firsts))
        convs = sum(isinstance(m, nn.Conv2d) for m in ResNet(arch).modules())
        (w, f), (cw, cf) = out["resnet"], out["conv_free"]
        return convs, w, f, max(f - w, 0.0) / convs, max(cf - cw, 0.0)
    finally:
        torch.backends.cudnn.benchmark = False


def gil_free_while_planning(arch, batch):
    """Does planning hold the GIL? A Python spinner thread counts while a brand-new thread runs its
    first forward (planning every convolution); its rate against its rate while the main thread
    sleeps: near 0 if the planning thread held the GIL, near 1 (or what the cores allow) if not."""
    model = ResNet(arch).cuda(0).train()
    x = torch.randn(batch, 3, 32, 32, device="cuda:0")
    model(x)
    sync_all()
    count, stop = [0], [False]

    def spin():
        while not stop[0]:
            count[0] += 1
    sp = threading.Thread(target=spin, daemon=True)
    sp.start()
    time.sleep(0.05)
    c0, t0 = count[0], time.perf_counter()
    time.sleep(0.2)
    free = (count[0] - c0) / (time.perf_counter() - t0)

    def first():
        model(x)
        sync_all()
    th = threading.Thread(target=first)
    c0, t0 = count[0], time.perf_counter()
    th.start()
    th.join()
    during = (count[0] - c0) / (time.perf_counter() - t0)
    stop[0] = True
    sp.join()
    return during / free


class Holder(nn.Module):
    """One module holding n one-element parameters: replicate's per-tensor work, little else."""

    def __init__(self, n, dev):
        super().__init__()
        for i in range(n):
            self.register_parameter(f"p{i}", nn.Parameter(torch.zeros(1, device=dev)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet18", choices=["resnet18", "tiny"])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--batch", type=int, default=128, help="per-GPU batch for the planning cost")
    ap.add_argument("--plan-threads", type=int, default=5, help="new threads timed per plan cost")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("calibrate_dp.py needs a CUDA GPU (it times nn.DataParallel's pieces on it)")
    torch.backends.cudnn.benchmark = False
    ngpu = torch.cuda.device_count()
    devs = [0, 1] if ngpu > 1 else [0, 0]  # one GPU: two replicas on it, for the thread pieces
    R = args.repeat
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {ngpu} GPU(s): "
          f"{torch.cuda.get_device_name(0)}; cudnn.benchmark off; median of {R} calls")
    got = dict(DEFAULTS)

    def measure(name, fn):
        try:
            return fn()
        except Exception as e:  # one piece failing must not lose the others
            print(f"  {name}: could not be measured here ({type(e).__name__}: {e}); "
                  f"keeping the default")
            return None

    model = ResNet(args.model)
    n_mod = len(list(model.modules()))
    n_ten = len(list(model.parameters())) + len(list(model.buffers()))
    print(f"{args.model}: {n_mod} modules, {n_ten} parameters + buffers, "
          f"{c_layer_count(model)} forward ops in stage 2's layer list")

    r = measure("per-op cost", lambda: per_op(args.model, devs, R))
    if r:
        ops, one, two, ser = r
        print(f"forward op: {one:.2f} µs per op from one thread; {two:.2f} µs per op with two threads "
              f"at once -> {ser:.2f} µs per op serialized (GIL)")
        got["op"] = ser

    K1, K2 = 16, 128
    calls = []
    chains = [nn.Sequential(*[nn.Identity() for _ in range(k)]).cuda(0) for k in (K1, K2)]
    r = measure("replicate per module", lambda: [time_host(lambda: replicate(c, [0]), R) for c in chains])
    if r:
        got["module"] = max((r[1] - r[0]) / (K2 - K1), 0.0)
        rep_call = max(r[0] - (K1 + 1) * got["module"], 0.0)
        calls.append(("replicate", rep_call))
        print(f"replicate: {got['module']:.2f} µs per module per replica, {rep_call:.1f} µs per call")
    holders = [Holder(k, "cuda:0") for k in (K1, K2)]
    r = measure("replicate per parameter", lambda: [time_host(lambda: replicate(h, [0]), R) for h in holders])
    if r:
        got["param"] = max((r[1] - r[0]) / (K2 - K1), 0.0)
        print(f"replicate: {got['param']:.2f} µs per parameter or buffer per replica")

    def reduce_pieces():
        out = []
        for k in (K1, K2):
            grads = [[torch.zeros(1, device=f"cuda:{d}") for _ in range(k)] for d in devs]
            out.append(time_host(lambda: comm.reduce_add_coalesced(grads, 0), R))
        return out
    r = measure("reduce_add_coalesced", reduce_pieces)
    if r:
        per = max((r[1] - r[0]) / (K2 - K1) / len(devs), 0.0)
        red_call = max(r[0] - K1 * len(devs) * per, 0.0)
        calls.append(("reduce_add_coalesced", red_call))
        print(f"reduce_add_coalesced: {per:.2f} µs per gradient per replica (charged at the per-parameter "
              f"cost), {red_call:.1f} µs per call")

    sdevs = sorted(set(devs))
    x = torch.randn(2 * len(sdevs), 3, 32, 32, device="cuda:0")
    r = measure("scatter", lambda: time_host(lambda: scatter_kwargs((x,), {}, sdevs), R))
    if r is not None:
        calls.append(("scatter", r))
        print(f"scatter to {len(sdevs)} device(s): {r:.1f} µs per call")
    outs = [torch.randn(2, 10, device=f"cuda:{d}") for d in sdevs]
    r = measure("gather", lambda: time_host(lambda: gather(outs, 0), R))
    if r is not None:
        calls.append(("gather", r))
        print(f"gather from {len(sdevs)} device(s): {r:.1f} µs per call")

    ident = nn.Identity()
    ins = [(torch.zeros(1, device=f"cuda:{d}"),) for d in devs]
    r = measure("parallel_apply", lambda: [
        time_host(lambda: parallel_apply([ident], ins[:1], None, devs[:1]), R),
        time_host(lambda: parallel_apply([ident, ident], ins, None, devs), R)])
    if r:
        got["thread"] = max((r[1] - r[0]) / 2, 0.0)
        calls.append(("parallel_apply", r[0]))
        print(f"parallel_apply: {got['thread']:.1f} µs per thread (new Python thread, _worker's "
              f"contexts; includes the OS thread's own creation), {r[0]:.1f} µs per call")
    if calls:
        got["call"] = statistics.mean(c for _, c in calls)
        print(f"per call (mean of {', '.join(n for n, _ in calls)}): {got['call']:.1f} µs")

    if ngpu > 1:  # the whole of DataParallel.forward, against what stage 2 would charge for it
        def dp_forward():
            net = nn.DataParallel(ResNet(args.model).cuda(0), device_ids=[0, 1])
            xx = torch.randn(4, 3, 32, 32, device="cuda:0")
            return time_host(lambda: net(xx), max(R // 4, 20))
        r = measure("DataParallel.forward", dp_forward)
        if r is not None:
            modelled = (4 * got["call"] + 2 * (n_mod * got["module"] + n_ten * got["param"])
                        + 2 * got["thread"] + 2 * c_layer_count(model) * got["op"])
            print(f"DataParallel.forward on 2 GPUs: {r:.0f} µs host time measured; the charges above "
                  f"add up to {modelled:.0f} µs of Python for it (the rest is C++ and launches)")

    for key, bench in (("plan", False), ("plan_bench", True)):
        r = measure(f"planning cost, cudnn.benchmark {'on' if bench else 'off'}",
                    lambda: plan_cost(args.model, args.batch, bench, max(args.plan_threads, 3)))
        if r:
            convs, w, f, per, other = r
            got[key] = per
            print(f"plan cache, cudnn.benchmark {'on ' if bench else 'off'}: forward {w / 1e3:.2f} ms warm, "
                  f"{f / 1e3:.2f} ms as a new thread's first -> {per:.1f} µs per convolution ({convs} convs, "
                  f"batch {args.batch}); a conv-free model's first forward in a new thread costs "
                  f"{other:.1f} µs more than warm (not planning; the per-convolution charge includes it)")

    r = measure("GIL during planning", lambda: gil_free_while_planning(args.model, args.batch))
    if r is not None:
        print(f"GIL while a new thread plans its first forward: a Python spinner thread ran at {100 * r:.0f}% of "
              f"its free rate ({'so planning does not hold the GIL' if r > 0.2 else 'planning HOLDS the GIL'})")

    switch_ms = 1e3 * sys.getswitchinterval()
    print(f"flags: --gil-switch-ms {switch_ms:g} --gil-op-us {got['op']:.2f} "
          f"--gil-host-call-us {got['call']:.1f} --gil-host-module-us {got['module']:.2f} "
          f"--gil-host-param-us {got['param']:.2f} --gil-host-thread-us {got['thread']:.1f} "
          f"--dp-plan-us {got['plan']:.1f} --dp-plan-bench-us {got['plan_bench']:.1f}")


if __name__ == "__main__":
    main()
