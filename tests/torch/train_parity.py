"""train_parity.py — PyTorch trains ResNet-18 with the stages' default recipe, on the same files.

    python3 tests/torch/train_parity.py DIR [--seed S] [--amp off|fp16|bf16] [--epochs 5]
            [--model resnet18|tiny] [--train-size N] [--test-size M] [--device cuda|cpu]
            [--nproc N --batch-size B]      DDP: N processes, B images each (./stage3's twin)

DIR holds CIFAR-10 binary files (data_batch_1..5.bin, test_batch.bin): real CIFAR-10, or the stages'
synthetic set written by tests/write_synthetic. The recipe is ./stage1's default, written the
way a PyTorch user writes it:

  model     models.ResNet (common/model.c's twin), PyTorch's default initialisation, seeded by
            torch.manual_seed(S)
  data      each epoch's order torch.randperm(N, generator seeded with S + epoch) — the very order
            the stages use (rng.h); RandomCrop(32, padding=4) with zero padding before Normalize, and
            RandomHorizontalFlip, drawn here from torch's generator (the stages key theirs by a hash
            of seed, epoch and sample: same distribution, other draws); batch 128, the last batch short
  optimizer SGD(lr 0.1, momentum 0.9, weight_decay 5e-4), CosineAnnealingLR(T_max = all steps),
            stepped after every optimizer step
  numerics  fp32 with TF32 convolutions and matmuls (--amp off), or torch.autocast fp16 with a
            GradScaler (PyTorch's defaults: 2^16, x2 every 2000 finite steps) or bf16 without one;
            cudnn.benchmark off
  eval      model.eval() on the test files after every epoch
  DDP       (--nproc 2) torch.multiprocessing starts the ranks; DistributedDataParallel with its
            defaults (25 MiB buckets, buffers broadcast from rank 0), DistributedSampler(shuffle, seed S,
            set_epoch) — the shards ./stage3 computes; NCCL with a GPU per rank, else gloo (two ranks
            sharing one GPU, as ./stage3 --comm host does, or the CPU); rank 0 evaluates and prints

Prints one JSON line per epoch ({"type": "epoch", "epoch", "train_loss", "train_acc", "test_loss",
"test_acc"}) and a last {"type": "summary", "test_acc", "seconds", ...}: the keys of the stages' --report.
The augmentation runs on the device, in one batch, so the input pipeline costs PyTorch little.
"""
import argparse
import json
import math
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import ResNet  # noqa: E402

MEAN = (0.4914, 0.4822, 0.4465)  # common/data.c's DATA_MEAN and DATA_STD
STD = (0.2470, 0.2435, 0.2616)
RECORD = 1 + 3072


def read_split(d, names, limit):
    raw = b"".join(open(os.path.join(d, n), "rb").read() for n in names)
    if len(raw) % RECORD:
        sys.exit(f"error: {d}: not whole {RECORD}-byte CIFAR-10 records")
    rec = np.frombuffer(raw, np.uint8).reshape(-1, RECORD)
    if limit:
        if limit > len(rec):
            sys.exit(f"error: asked for {limit} samples, {d} holds {len(rec)}")
        rec = rec[:limit]
    return rec[:, 1:].reshape(-1, 3, 32, 32).copy(), rec[:, 0].astype(np.int64)


def normalise(u8, mean, std):
    return (u8.float() / 255.0 - mean) / std


def augment(u8, gen, mean, std):
    """RandomCrop(32, padding=4) (zeros, before Normalize) + RandomHorizontalFlip, per sample."""
    n = u8.shape[0]
    dev = u8.device
    padded = F.pad(u8, (4, 4, 4, 4))  # 40x40, zero bytes: a padded pixel normalises to -mean/std
    oy = torch.randint(0, 9, (n,), generator=gen, device=dev)
    ox = torch.randint(0, 9, (n,), generator=gen, device=dev)
    flip = torch.rand(n, generator=gen, device=dev) < 0.5
    r = torch.arange(32, device=dev)
    iy = (oy[:, None] + r)[:, None, :, None]  # crop, then flip the crop
    cols = torch.where(flip[:, None], 31 - r, r)
    ix = (ox[:, None] + cols)[:, None, None, :]
    img = padded[torch.arange(n, device=dev)[:, None, None, None], torch.arange(3, device=dev)[None, :, None, None], iy, ix]
    return normalise(img, mean, std)


def count(least):
    """argparse type: a whole number >= least (0 epochs or ranks would print nothing, or die later)."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            v = least - 1
        if v < least:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number from {least} up")
        return v
    return parse


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=count(1), default=1, help="DDP ranks (processes); 1: no DDP")
    ap.add_argument("dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--amp", default="off", choices=["off", "fp16", "bf16"])
    ap.add_argument("--epochs", type=count(1), default=5)
    ap.add_argument("--batch-size", type=count(1), default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--model", default="resnet18", choices=["resnet18", "tiny"])
    ap.add_argument("--train-size", type=count(0), default=0, help="0: every record of the files")
    ap.add_argument("--test-size", type=count(0), default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    if a.nproc == 1:
        return train(0, a, None)
    with socket.socket() as sk:  # a free port for the ranks' rendezvous
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    mp.spawn(train, args=(a, port), nprocs=a.nproc)


def train(rank, a, port):
    world = a.nproc
    if port is not None:
        gpus = torch.cuda.device_count() if a.device == "cuda" else 0
        dist.init_process_group("nccl" if gpus >= world else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world)
        if gpus:
            torch.cuda.set_device(rank % gpus)
    dev = torch.device(f"cuda:{torch.cuda.current_device()}" if a.device == "cuda" else "cpu")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    xtr, ytr = read_split(a.dir, [f"data_batch_{k}.bin" for k in range(1, 6)], a.train_size)
    xte, yte = read_split(a.dir, ["test_batch.bin"], a.test_size)
    xtr, ytr = torch.from_numpy(xtr).to(dev), torch.from_numpy(ytr).to(dev)
    xte, yte = torch.from_numpy(xte).to(dev), torch.from_numpy(yte).to(dev)
    mean = torch.tensor(MEAN, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=dev).view(1, 3, 1, 1)

    torch.manual_seed(a.seed)
    net = ResNet(a.model).to(dev)
    model = DDP(net, device_ids=[dev] if dev.type == "cuda" else None) if world > 1 else net
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4)
    n = len(ytr)
    sampler = DistributedSampler(range(n), world, rank, shuffle=True, seed=a.seed) if world > 1 else None
    shard = len(sampler) if sampler else n
    steps_per_epoch = math.ceil(shard / a.batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.epochs * steps_per_epoch)
    dtype = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}[a.amp]
    scaler = torch.amp.GradScaler(dev.type) if a.amp == "fp16" else None
    aug_gen = torch.Generator(device=dev).manual_seed(a.seed * 1000 + rank)
    skipped = 0
    t0 = time.time()
    for epoch in range(a.epochs):
        model.train()
        if sampler:
            sampler.set_epoch(epoch)
            order = torch.tensor(list(iter(sampler)), device=dev)
        else:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(a.seed + epoch)).to(dev)
        loss_sum = torch.zeros((), device=dev)
        correct = torch.zeros((), device=dev, dtype=torch.int64)
        for b in range(steps_per_epoch):
            idx = order[b * a.batch_size:(b + 1) * a.batch_size]
            x, y = augment(xtr[idx], aug_gen, mean, std), ytr[idx]
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
                logits = model(x)
                loss = F.cross_entropy(logits, y)
            if scaler:
                scale = scaler.get_scale()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                skipped += scaler.get_scale() < scale  # a backed-off scale: this step was skipped
            else:
                loss.backward()
                opt.step()
            sched.step()
            loss_sum += loss.detach().float() * len(y)
            correct += (logits.argmax(1) == y).sum()
        seen = torch.tensor([float(len(order))], device=dev)
        if world > 1:  # the epoch's figures over every rank's samples
            for t in (loss_sum, correct, seen):
                dist.all_reduce(t)
        if rank == 0:
            test_loss, test_acc = evaluate(net, xte, yte, mean, std, a.batch_size, dtype, dev)
            print(json.dumps({"type": "epoch", "epoch": epoch + 1, "train_loss": loss_sum.item() / seen.item(),
                              "train_acc": correct.item() / seen.item(), "test_loss": test_loss,
                              "test_acc": test_acc}), flush=True)
        if world > 1:
            dist.barrier()
    if rank == 0:
        print(json.dumps({"type": "summary", "test_acc": test_acc, "test_loss": test_loss, "seed": a.seed,
                          "amp": a.amp, "model": a.model, "epochs": a.epochs, "world_size": world,
                          "batch_size": a.batch_size, "steps": a.epochs * steps_per_epoch,
                          "skipped_steps": int(skipped), "seconds": time.time() - t0, "torch": torch.__version__,
                          "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}), flush=True)
    if world > 1:
        dist.destroy_process_group()


@torch.no_grad()
def evaluate(model, x, y, mean, std, bs, dtype, dev):
    model.eval()
    loss, correct = 0.0, 0
    for i in range(0, len(y), bs):
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            logits = model(normalise(x[i:i + bs], mean, std))
        loss += F.cross_entropy(logits.float(), y[i:i + bs], reduction="sum").item()
        correct += (logits.argmax(1) == y[i:i + bs]).sum().item()
    return loss / len(y), correct / len(y)


if __name__ == "__main__":
    main()
