"""amp_fixtures.py — PyTorch as the oracle for stage 5 (mixed precision): writes tests/fixtures/amp*.bin.

    python3 tests/torch/amp_fixtures.py                 # CPU: conversions + bf16 CPU autocast -> amp.bin
    python3 tests/torch/amp_fixtures.py --device cuda   # GPU: fp16 and bf16 CUDA autocast -> amp_cuda.bin

Same container as fixtures.py (b"FIXT0001" records), written here with torch and struct only.

amp.bin
  conv.in        int32  float32 bit patterns: specials, fp16/bf16 boundaries and ties, random bits
  conv.f16       int32  torch's x.half() of each, as 16-bit patterns
  conv.bf16      int32  torch's x.bfloat16() of each
  bf16_cpu.*     the tiny ResNet (bn) under torch.autocast("cpu", torch.bfloat16): initial params
                 and buffers, the batch, the logits (cast to fp32 for the loss, as autocast does),
                 the loss, the parameter gradients of loss * scale, and the buffers after the forward
amp_cuda.bin     fp16_cuda.* and bf16_cuda.*: the same under torch.autocast("cuda", ...) on the GPU
"""
import argparse
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ResNet  # noqa: E402

DT = {torch.float32: 0, torch.float64: 1, torch.int64: 2, torch.int32: 3}


def write(path, records):
    with open(path, "wb") as f:
        f.write(b"FIXT0001")
        for name, t in records.items():
            t = t.detach().cpu().contiguous()
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", DT[t.dtype], t.dim()))
            f.write(struct.pack("<%dI" % t.dim(), *t.shape))
            f.write(bytes(t.untyped_storage())[
                t.storage_offset() * t.element_size():(t.storage_offset() + t.numel()) * t.element_size()])


def conversions():
    vals = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0,
            65504.0, 65519.0, 65519.99, 65520.0, 65520.01, 65536.0, -65520.0, 1e10, -1e30,
            2.0**-14, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-26, 3 * 2.0**-25, 2.0**-24 * 1.5,
            2.0**-14 - 2.0**-25, 2.0**-14 - 2.0**-26, 1e-45, 1.17549435e-38, 3.4028235e38, 3.39e38]
    bits = torch.tensor(vals, dtype=torch.float32).view(torch.int32)
    # ties and neighbours: 1 + k/2048 (fp16 midpoints around 1) and 1 + k/256 (bf16 midpoints)
    k = torch.arange(0, 64, dtype=torch.float32)
    near = torch.cat([1 + (2 * k + 1) / 2048, 1 + (2 * k + 1) / 256, 1000 + (2 * k + 1) / 64])
    near_b = near.view(torch.int32)
    g = torch.Generator().manual_seed(5)
    rand_bits = torch.randint(-2**31, 2**31 - 1, (4096,), generator=g, dtype=torch.int64).to(torch.int32)
    # random values in fp16's range, where most of the interesting rounding happens
    rand_small = (torch.randn(2048, generator=g) * torch.exp2(torch.randint(-26, 17, (2048,), generator=g).float()))
    allb = torch.cat([bits, near_b, near_b - 1, near_b + 1, rand_bits, rand_small.view(torch.int32)])
    x = allb.view(torch.float32)
    return {"conv.in": allb,
            "conv.f16": x.half().view(torch.int16).to(torch.int32) & 0xFFFF,
            "conv.bf16": x.bfloat16().view(torch.int16).to(torch.int32) & 0xFFFF}


def flat(ts):
    return torch.cat([t.detach().float().reshape(-1).cpu() for t in ts])


def tiny_autocast(tag, device, dtype, scale):
    """The tiny ResNet's first step under autocast, as test_amp.c replays it."""
    torch.manual_seed(7)
    model = ResNet("tiny", norm=True).to(device)
    params = [p for _, p in model.named_parameters()]
    bufs = [b for n, b in model.named_buffers() if not n.endswith("num_batches_tracked")]
    g = torch.Generator().manual_seed(99)
    x = torch.randn(8, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (8,), generator=g)
    rec = {f"{tag}.params0": flat(params), f"{tag}.buffers0": flat(bufs), f"{tag}.x": x,
           f"{tag}.y": y.to(torch.int32)}
    with torch.autocast(device_type=device, dtype=dtype):
        logits = model(x.to(device))
        loss = F.cross_entropy(logits, y.to(device))
    assert logits.dtype == dtype and loss.dtype == torch.float32
    (loss * scale).backward()
    rec.update({f"{tag}.logits": logits.float().cpu(), f"{tag}.loss": loss.detach().double().cpu().reshape(1),
                f"{tag}.scale": torch.tensor([scale], dtype=torch.float64),
                f"{tag}.grads": flat([p.grad for p in params]), f"{tag}.buffers1": flat(bufs)})
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.device == "cpu":
        rec = conversions()
        rec.update(tiny_autocast("bf16_cpu", "cpu", torch.bfloat16, 1.0))
        path = os.path.join(args.out, "amp.bin")
    else:
        torch.backends.cudnn.allow_tf32 = False  # conv in fp32 compute for the fp16 inputs either way
        rec = tiny_autocast("fp16_cuda", "cuda", torch.float16, 1024.0)
        rec.update(tiny_autocast("bf16_cuda", "cuda", torch.bfloat16, 1.0))
        path = os.path.join(args.out, "amp_cuda.bin")
    write(path, rec)
    print(f"wrote {os.path.abspath(path)} ({os.path.getsize(path)} bytes) with torch {torch.__version__}")


if __name__ == "__main__":
    main()
