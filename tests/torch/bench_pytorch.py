"""bench_pytorch.py — the PyTorch baselines that the stages are compared against.

    python3 tests/torch/bench_pytorch.py --model resnet18 --batch 128 --steps 200
    python3 tests/torch/bench_pytorch.py --amp bf16 --channels-last --fused        # best eager (stage 5)
    python3 tests/torch/bench_pytorch.py --amp bf16 --channels-last --fused --compile

Same model (models.py), synthetic data already on the GPU, SGD with momentum 0.9 and weight decay
5e-4, cudnn.benchmark on (--cudnn-benchmark off: off). Default: fp32 with PyTorch's default TF32 policy for convolutions.
--amp fp16|bf16: torch.autocast with that dtype (fp16 with a torch.amp.GradScaler, as the
recipe says; bf16 without); --channels-last: model and input in torch.channels_last; --fused:
SGD(fused=True), one kernel for the whole update (with fp16, mind torch 2.11's fused SGD under a
GradScaler: after a skipped first step it steps from an unset momentum buffer — stage 5's lesson,
tests/torch/sgd_scaler_fixture.py; timing is unaffected, training is); --compile: torch.compile(model) (its warm-up
compiles, so more warm-up steps are used). Each step is timed with CUDA events at step starts
(as the C stages do); the median is reported, warm-up excluded. Prints one JSON line:
ms_per_iter_median, img_per_s, peak_mem_bytes.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

from models import ResNet
from timing import time_sgd_steps


def time_amp_steps(model, opt, x, y, warmup, steps, dtype, scaler):
    """timing.time_sgd_steps with the AMP step: autocast forward, scaled backward, scaler step."""
    total = warmup + steps
    events = [torch.cuda.Event(enable_timing=True) for _ in range(total + 1)]
    for i in range(total):
        events[i].record()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype):
            loss = F.cross_entropy(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
    events[total].record()
    torch.cuda.synchronize()
    ms = [events[i].elapsed_time(events[i + 1]) for i in range(warmup, total)]
    return statistics.median(ms), loss.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--amp", default="off", choices=["off", "fp16", "bf16"])
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--fused", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--cudnn-benchmark", default="on", choices=["on", "off"],
                    help="torch.backends.cudnn.benchmark (make compare: off, as the stages' default)")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = ResNet(args.model).to(dev)
    x = torch.randn(args.batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4,
                          **({"fused": True} if args.fused else {}))
    if args.compile:
        model = torch.compile(model)
    warmup = max(args.warmup, 50) if args.compile else args.warmup
    torch.cuda.reset_peak_memory_stats()
    if args.amp == "off":
        med, loss = time_sgd_steps(model, opt, x, y, warmup, args.steps)
    else:
        dtype = torch.float16 if args.amp == "fp16" else torch.bfloat16
        scaler = torch.amp.GradScaler("cuda") if args.amp == "fp16" else None
        med, loss = time_amp_steps(model, opt, x, y, warmup, args.steps, dtype, scaler)
    who = "pytorch" + ("" if args.amp == "off" else f" {args.amp} autocast") + \
        (" channels_last" if args.channels_last else "") + (" fused SGD" if args.fused else "") + \
        (" torch.compile" if args.compile else "")
    print(json.dumps({"type": "summary", "who": who, "model": args.model, "batch_size": args.batch,
                      "amp": args.amp, "channels_last": args.channels_last, "fused": args.fused,
                      "compile": args.compile, "cudnn_benchmark": args.cudnn_benchmark,
                      "ms_per_iter_median": med, "img_per_s": 1000.0 * args.batch / med,
                      "peak_mem_bytes": [torch.cuda.max_memory_allocated()],
                      "torch": torch.__version__, "loss": loss}))


if __name__ == "__main__":
    main()
