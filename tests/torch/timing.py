"""timing.py — how every PyTorch baseline times its training steps, the way the C stages do.

A CUDA event is recorded at the start of each step (and one after the last); a step's time is the
interval between consecutive events on the GPU's timeline, and the median over the steps after
warm-up is reported. Nothing synchronises inside the loop, as in the stages.
"""
import statistics

import torch
import torch.nn.functional as F


def time_sgd_steps(model, opt, x, y, warmup, steps, sync=torch.cuda.synchronize):
    """Train warmup + steps SGD steps on one fixed batch; return (median ms per step, last loss)."""
    total = warmup + steps
    events = [torch.cuda.Event(enable_timing=True) for _ in range(total + 1)]
    for i in range(total):
        events[i].record()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    events[total].record()
    sync()
    ms = [events[i].elapsed_time(events[i + 1]) for i in range(warmup, total)]
    return statistics.median(ms), loss.item()
