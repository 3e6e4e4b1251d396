"""dp_thread_cost.py — how much of nn.DataParallel's slowness is new threads meeting per-thread caches.

    python3 tests/torch/dp_thread_cost.py [--model resnet18] [--batch 128] [--steps 30] [--new-threads 10]

nn.DataParallel's parallel_apply starts a brand-new Python thread per replica at every forward.
PyTorch keeps several caches per thread (cuDNN execution plans among them), so a forward in a new
thread may pay again what a warm thread paid once. This script measures that directly, for
cudnn.benchmark off and on:
  warm       forward of the model in the main (warm) thread, wall time with a sync
  new_first  the first forward in a brand-new thread
  new_second the second forward in that same thread
  single     one training step on one GPU (batch --batch)
  dp_stock   one nn.DataParallel training step over 2 GPUs (batch 2 × --batch), stock
  dp_pool    the same with parallel_apply patched to use two persistent threads
Every figure is the median wall time in ms over --steps repetitions (after a warm-up), each ended
by a synchronisation of every GPU. One JSON line per cudnn.benchmark setting.
"""
import argparse
import json
import queue
import statistics
import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.parallel  # noqa: F401  (loads the modules below)

from models import ResNet

# torch.nn.parallel re-exports functions named like these modules, so take the modules themselves.
dp_mod = sys.modules["torch.nn.parallel.data_parallel"]
pa_mod = sys.modules["torch.nn.parallel.parallel_apply"]


def sync_all():
    for d in range(torch.cuda.device_count()):
        torch.cuda.synchronize(d)


def wall(fn):
    sync_all()
    t0 = time.perf_counter()
    fn()
    sync_all()
    return 1e3 * (time.perf_counter() - t0)


def in_new_thread(fn, k):
    """Run fn k times in one brand-new thread; return the k wall times."""
    out = []
    th = threading.Thread(target=lambda: out.extend(wall(fn) for _ in range(k)))
    th.start()
    th.join()
    return out


class Pool:
    """Persistent worker threads, one per replica (the fix): same call shape as parallel_apply."""

    def __init__(self, n):
        self.q = [queue.Queue() for _ in range(n)]
        self.r = [queue.Queue() for _ in range(n)]
        for i in range(n):
            threading.Thread(target=self.loop, args=(i,), daemon=True).start()

    def loop(self, i):
        torch.set_grad_enabled(True)
        while True:
            fn = self.q[i].get()
            try:
                self.r[i].put((fn(), None))
            except Exception as e:  # handed back to the caller, as parallel_apply does
                self.r[i].put((None, e))

    def apply(self, modules, inputs, kwargs_tup=None, devices=None):
        grad = torch.is_grad_enabled()
        for i, (m, x) in enumerate(zip(modules, inputs)):
            dev = devices[i] if devices else x[0].device

            def fn(m=m, x=x, dev=dev):
                with torch.set_grad_enabled(grad), torch.cuda.device(dev):
                    return m(*x)
            self.q[i].put(fn)
        outs = []
        for i in range(len(modules)):
            o, e = self.r[i].get()
            if e is not None:
                raise e
            outs.append(o)
        return outs


def train_step_ms(model, opt, x, y, steps, warmup=5):
    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for _ in range(warmup):
        wall(step)
    return statistics.median(wall(step) for _ in range(steps))


def measure(arch, batch, steps, benchmark, new_threads):
    torch.backends.cudnn.benchmark = benchmark
    torch.manual_seed(0)
    res = {"type": "dp_thread_cost", "model": arch, "batch_size": batch, "cudnn_benchmark": benchmark,
           "torch": torch.__version__, "gpus": torch.cuda.device_count()}
    model = ResNet(arch).cuda(0)
    x = torch.randn(batch, 3, 32, 32, device="cuda:0")
    y = torch.randint(0, 10, (batch,), device="cuda:0")
    fwd = lambda: model(x)
    for _ in range(5):
        wall(fwd)
    res["warm_ms"] = statistics.median(wall(fwd) for _ in range(steps))
    firsts, seconds = [], []
    for _ in range(new_threads):
        a, b = in_new_thread(fwd, 2)
        firsts.append(a)
        seconds.append(b)
    res["new_first_ms"] = statistics.median(firsts)
    res["new_second_ms"] = statistics.median(seconds)
    res["new_first_range_ms"] = [min(firsts), max(firsts)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    res["single_ms"] = train_step_ms(model, opt, x, y, steps)
    if torch.cuda.device_count() >= 2:
        dpm = nn.DataParallel(model, device_ids=[0, 1])
        x2 = torch.randn(2 * batch, 3, 32, 32, device="cuda:0")
        y2 = torch.randint(0, 10, (2 * batch,), device="cuda:0")
        n = steps if not benchmark else max(3, steps // 10)  # benchmark on: each step re-searches
        res["dp_stock_ms"] = train_step_ms(dpm, opt, x2, y2, n, warmup=2)
        pool = Pool(2)
        orig = dp_mod.parallel_apply
        dp_mod.parallel_apply = pool.apply
        try:
            res["dp_pool_ms"] = train_step_ms(dpm, opt, x2, y2, steps)
        finally:
            dp_mod.parallel_apply = orig
        for k in ("dp_stock_ms", "dp_pool_ms"):  # images/s relative to one GPU
            res[k.replace("_ms", "_vs_single")] = (2 * batch / res[k]) / (batch / res["single_ms"])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--new-threads", type=int, default=10, help="brand-new threads timed per setting")
    args = ap.parse_args()
    assert pa_mod.parallel_apply is dp_mod.parallel_apply  # what we patch is what DataParallel calls
    for benchmark in (False, True):
        print(json.dumps(measure(args.model, args.batch, args.steps, benchmark, args.new_threads)), flush=True)


if __name__ == "__main__":
    main()
