"""bench_pytorch.py — the PyTorch eager baseline that the stages are compared against.

    python3 tests/torch/bench_pytorch.py --model resnet18 --batch 128 --steps 200

Same model (models.py), synthetic data already on the GPU, SGD with momentum 0.9 and weight decay
5e-4, cudnn.benchmark on (--cudnn-benchmark off: off), fp32 with PyTorch's default TF32 policy for convolutions. Each step is
timed with CUDA events at step starts (as the C stages do); the median is reported, warm-up
excluded. Prints one JSON line: ms_per_iter_median, img_per_s, peak_mem_bytes.
"""
import argparse
import json

import torch

from models import ResNet
from timing import time_sgd_steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--cudnn-benchmark", default="on", choices=["on", "off"],
                    help="torch.backends.cudnn.benchmark (make compare: off, as the stages' default)")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = ResNet(args.model).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(args.batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    torch.cuda.reset_peak_memory_stats()
    med, loss = time_sgd_steps(model, opt, x, y, args.warmup, args.steps)
    print(json.dumps({"type": "summary", "who": "pytorch", "model": args.model, "batch_size": args.batch, "cudnn_benchmark": args.cudnn_benchmark,
                      "ms_per_iter_median": med, "img_per_s": 1000.0 * args.batch / med,
                      "peak_mem_bytes": [torch.cuda.max_memory_allocated()],
                      "torch": torch.__version__, "loss": loss}))


if __name__ == "__main__":
    main()
