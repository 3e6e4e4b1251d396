"""checkpoint_to_torch.py — a checkpoint written by --save, as a PyTorch model.

    python3 tests/torch/checkpoint_to_torch.py CKPT                 check it and say what it holds
    python3 tests/torch/checkpoint_to_torch.py CKPT --out model.pt  ...and save its state_dict for torch

The trainer's checkpoint is the article's `torch.save(model.module.state_dict())` plus the optimizer's
state and the data position: rank 0 writes it, and the weights in it are the plain model's, whatever
stage, world size or precision trained them. This script reads it with nothing but the standard
library (the format: common/checkpoint.c's header comment), verifies its checksum, and — when torch is
installed — loads the weights and batch-norm statistics into tests/torch/models.py's twin of the C
model (the same state_dict names and order), checks the checkpoint's shape fingerprint against that
model's, and saves `model.state_dict()`. Load it with:

    import torch; from models import ResNet
    model = ResNet("resnet18"); model.load_state_dict(torch.load("model.pt")); model.eval()

--logits IN OUT (a test's oracle, and a way to see it for yourself): run the model in eval mode on
IN, raw little-endian float32 images [N][3][32][32] already normalised as the trainer feeds them,
and write the logits [N][10] to OUT as raw float32.

Exit codes: 0 done, 1 not a valid checkpoint (missing, truncated, corrupt), 2 a bad command line or a
checkpoint this model cannot hold, 3 torch is needed for what was asked and is not installed.
"""
import argparse
import array
import math
import os
import stat
import struct
import sys

MAGIC = b"DPDDPCKP"
HEADER_SIZE = {1: 128, 2: 192, 3: 192, 4: 192, 5: 256, 6: 256, 7: 272, 8: 296, 9: 304}
FNV_INIT, FNV_PRIME, MASK64 = 0xcbf29ce484222325, 0x100000001b3, (1 << 64) - 1
OPTIMIZERS = {0: "sgd", 1: "adam"}
DATA = {0: "unknown", 1: "synthetic", 2: "cifar10"}


def fail(code, msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def fnv1a64(data, h=FNV_INIT):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return h


def read_checkpoint(path):
    """The header's fields and the float blobs, verified as common/checkpoint.c's checkpoint_load verifies
    them (magic, version, sizes, checksum, and counters a run could have written: counters_possible)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO or a device would block or never end
            fail(1, f"checkpoint '{path}' is not a regular file (give a .ckpt file written by --save)")
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        fail(1, f"cannot read checkpoint '{path}': {e.strerror}")
    if raw[:8] != MAGIC[:len(raw[:8])]:  # a short prefix of the magic reads as truncated, as in C
        fail(1, f"'{path}' is not a checkpoint of this trainer (wrong magic; expected a file written by --save)")
    if len(raw) < 128:
        fail(1, f"checkpoint '{path}' is truncated ({len(raw)} bytes)")
    version, hsize = struct.unpack_from("<II", raw, 8)
    if version not in HEADER_SIZE:
        fail(1, f"checkpoint '{path}' has format version {version}; this script reads 1 to {max(HEADER_SIZE)}")
    if hsize != HEADER_SIZE[version] or len(raw) < hsize:
        fail(1, f"checkpoint '{path}' is corrupt or truncated: header size {hsize}")
    h = raw[:hsize] + bytes(max(HEADER_SIZE.values()) - hsize)  # later versions' fields read as 0, as the C reader does
    i64 = lambda off: struct.unpack_from("<q", h, off)[0]  # noqa: E731
    f64 = lambda off: struct.unpack_from("<d", h, off)[0]  # noqa: E731
    meta = {
        "version": version,
        "arch": h[16:48].split(b"\0")[0].decode("ascii", "replace"),
        "norm": h[48:56].split(b"\0")[0].decode("ascii", "replace"),
        "n_params": i64(56), "n_buffers": i64(64), "shape_hash": struct.unpack_from("<Q", h, 72)[0],
        "step": i64(80), "epoch": i64(88), "batch_in_epoch": i64(96), "seed": i64(104),
        "world_size": i64(120), "batch_size": i64(128), "train_size": i64(136), "accum_steps": i64(144),
        "data_source": DATA.get(i64(168), "unknown"), "optimizer": OPTIMIZERS.get(i64(232), "?"),
        "scaler_scale": f64(192), "lr": f64(248), "warmup_steps": i64(256),
        # the optimizer's hyperparameters (version 8; 0 before: unknown) — torch.optim's param_groups'
        # momentum and weight_decay, and clip_grad_norm_'s max_norm
        "momentum": f64(272), "weight_decay": f64(280), "clip_grad_norm": f64(288),
        # the training set's signature (version 9; 0 before: unknown) — what a resume checks --data against
        "data_signature": struct.unpack_from("<Q", h, 296)[0],
    }
    n_p, n_b = meta["n_params"], meta["n_buffers"]
    if not (0 < n_p < 1 << 40 and 0 <= n_b < 1 << 40) or meta["optimizer"] == "?":
        fail(1, f"checkpoint '{path}' is corrupt: impossible sizes in its header")
    blobs = 3 if meta["optimizer"] == "adam" else 2  # parameters, then momentum (Adam: exp_avg, exp_avg_sq)
    want = hsize + 4 * (blobs * n_p + n_b) + 8
    if len(raw) != want:
        fail(1, f"checkpoint '{path}' is {'truncated' if len(raw) < want else 'corrupt'}: {len(raw)} bytes where "
                f"its header implies {want}")
    stored = struct.unpack_from("<Q", raw, want - 8)[0]
    if want > 16 << 20:  # pure Python hashes about 6 MB/s (ResNet-18's 89 MB: 15 s on the device machine)
        print(f"checking the checksum of {want / 2**20:.0f} MiB in pure Python (about {want / 6e6:.0f} s)...",
              file=sys.stderr, flush=True)
    if fnv1a64(memoryview(raw)[:want - 8]) != stored:
        fail(1, f"checkpoint '{path}' is corrupt: checksum mismatch — the file was damaged after it was written")
    huge, v = 1 << 53, version
    possible = {  # what this script prints or uses, as counters_possible checks it
        "step": 0 <= meta["step"] <= huge, "epoch": 0 <= meta["epoch"] <= huge,
        "batch_in_epoch": 0 <= meta["batch_in_epoch"] <= huge, "world_size": 1 <= meta["world_size"] <= 1 << 24,
        "batch_size": v < 2 or 1 <= meta["batch_size"] <= 2**31 - 1,
        "accum_steps": v < 2 or 1 <= meta["accum_steps"] <= 2**31 - 1,
        "lr": v < 6 or (math.isfinite(meta["lr"]) and meta["lr"] >= 0),
        "warmup_steps": v < 7 or 0 <= meta["warmup_steps"] <= huge,
        "momentum": v < 8 or (0 <= meta["momentum"] < 1 and (meta["optimizer"] == "sgd" or meta["momentum"] == 0)),
        "weight_decay": v < 8 or 0 <= meta["weight_decay"] <= 1,
        "clip_grad_norm": v < 8 or 0 <= meta["clip_grad_norm"] <= 1e30,
    }
    wrong = [k for k, ok in possible.items() if not ok]
    if wrong:  # only a hand-made file, its checksum recomputed, gets here
        fail(1, f"checkpoint '{path}' is corrupt: impossible {', '.join(f'{k} {meta[k]}' for k in wrong)} in its header")
    floats = array.array("f")
    floats.frombytes(raw[hsize:hsize + 4 * (n_p + n_b)])
    if sys.byteorder != "little":
        floats.byteswap()
    # as the trainer's --evaluate and --resume refuse it (resume.c refuse_nonfinite): a NaN model converts
    # to a state_dict whose every output is NaN. The trainer never saves one; an older build or an edit might.
    for what, blob in (("the parameters are", floats[:n_p]), ("the batch-norm running statistics are", floats[n_p:])):
        if not all(map(math.isfinite, blob)):
            fail(1, f"checkpoint '{path}' cannot be used: {what} not finite (NaN or inf) — the run that saved it had "
                    f"diverged; use an earlier checkpoint of that run")
    return meta, floats[:n_p], floats[n_p:]


def shape_fingerprint(named_shapes):
    """common/model.c's shape_hash: FNV-1a over each parameter's name, then its shape as four int32."""
    h = FNV_INIT
    for name, shape in named_shapes:
        h = fnv1a64(name.encode(), h)
        h = fnv1a64(struct.pack("<4i", *(list(shape) + [0] * (4 - len(shape)))), h)
    return h


def to_torch(meta, params, buffers, path):
    try:
        import torch
    except ImportError:
        fail(3, "torch is not installed here (pip install torch): the checkpoint was checked, but not converted")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from models import ResNet

    if meta["arch"] not in ("resnet18", "tiny") or meta["norm"] not in ("bn", "none"):
        fail(2, f"checkpoint '{path}' holds model {meta['arch']!r} with norm {meta['norm']!r}, which models.py lacks")
    model = ResNet(meta["arch"], norm=meta["norm"] == "bn")
    named = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    # --unused-param (stages 3–5) trains a second head that no layer uses: it sits after the others
    extra = [("fc_unused.weight", named[-2][1]), ("fc_unused.bias", named[-1][1])]
    total = sum(p.numel() for p in model.parameters())
    if shape_fingerprint(named + extra) == meta["shape_hash"]:
        print("note: dropping fc_unused, the extra head --unused-param trained (no layer uses it)")
    elif shape_fingerprint(named) != meta["shape_hash"]:
        fail(2, f"checkpoint '{path}' has shape fingerprint {meta['shape_hash']:016x}; models.py's {meta['arch']} "
                f"has {shape_fingerprint(named):016x}: the two model definitions differ")
    if len(params) < total:
        fail(2, f"checkpoint '{path}' has {len(params)} parameters, models.py's {meta['arch']} {total}")
    flat = torch.frombuffer(bytearray(params.tobytes()), dtype=torch.float32)
    bufs = torch.frombuffer(bytearray(buffers.tobytes()), dtype=torch.float32) if len(buffers) else None
    state, at, bat = {}, 0, 0
    for name, p in model.named_parameters():  # the checkpoint's order is this state_dict order
        state[name] = flat[at:at + p.numel()].view(p.shape).clone()
        at += p.numel()
    for name, b in model.named_buffers():  # running_mean, running_var per batch norm; its step counter
        if name.endswith("num_batches_tracked"):
            # forwards in training mode on each rank; with momentum set (0.1), torch never reads it
            state[name] = torch.tensor(meta["step"] * max(meta["accum_steps"], 1), dtype=torch.long)
            continue
        state[name] = bufs[bat:bat + b.numel()].view(b.shape).clone()
        bat += b.numel()
    if bat != len(buffers):
        fail(2, f"checkpoint '{path}' has {len(buffers)} buffer values, models.py's {meta['arch']} {bat}")
    model.load_state_dict(state, strict=True)
    model.eval()
    return model


def check_outputs(args):
    """What --out and --logits name, checked before any work (and before torch, which would fail late with a
    traceback, or write over the checkpoint itself): exit 2, naming the flag and the fix."""
    def same(a, b):
        try:
            return os.path.samefile(a, b)
        except OSError:
            return False

    def a_checkpoint(path):  # another of the run's checkpoints (--out DIR/epoch004.ckpt): as precious
        try:
            with open(path, "rb") as f:
                return f.read(len(MAGIC)) == MAGIC
        except OSError:  # missing, or a directory
            return False

    if args.logits and not os.path.isfile(args.logits[0]):
        fail(2, f"--logits IN '{args.logits[0]}' is not a file: give raw float32 images [N][3][32][32]")
    outs = [("--out", args.out)] if args.out is not None else []  # '--out ""' (an unset $VAR) is no absent --out
    outs += [("--logits OUT", args.logits[1])] if args.logits else []
    for flag, path in outs:
        example = "model.pt" if flag == "--out" else "logits.f32"
        if not path:
            fail(2, f"{flag} got an empty value: give it a file name, e.g. {example}")
        # 'models/' names a directory, existing or not: abspath would drop the '/' and the checks below pass it,
        # and torch.save or open() then fails after the conversion with a traceback
        if path.endswith(("/", os.sep)):
            bare = path.rstrip("/" + os.sep) or path
            if os.path.lexists(bare) and not os.path.isdir(bare):
                fail(2, f"{flag} '{path}' ends in '/', but '{bare}' is a file, not a directory — give {flag} a file "
                        f"name, e.g. {example}")
            fail(2, f"{flag} '{path}' ends in '/', a directory's name — give a file name, e.g. "
                    f"{os.path.join(path, example)}{'' if os.path.isdir(path) else f' (after mkdir -p {bare})'}")
        parent = os.path.dirname(os.path.abspath(path))
        for what, given in [("the checkpoint", args.checkpoint)] + ([("--logits IN", args.logits[0])] if args.logits else []):
            if same(path, given):
                fail(2, f"{flag} '{path}' is {what} itself: writing it would destroy it — give {flag} another file name")
        if a_checkpoint(path):
            fail(2, f"{flag} '{path}' is a checkpoint written by --save: writing it would destroy it — give {flag} "
                    f"another file name, e.g. {example}")
        if os.path.isdir(path):
            fail(2, f"{flag} '{path}' is a directory — give a file name in it, e.g. {os.path.join(path, example)}")
        if not os.path.isdir(parent):
            fail(2, f"{flag} '{path}': directory '{parent}' does not exist (create it first: mkdir -p {parent})")
    if len(outs) == 2 and (outs[0][1] == outs[1][1] or same(outs[0][1], outs[1][1])):
        fail(2, f"--out and --logits OUT are the same file '{args.out}': give each its own")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("checkpoint", help="a file written by a stage's --save (DIR/epoch003.ckpt, DIR/stepNNNNNNNN.ckpt)")
    ap.add_argument("--out", help="save the model's state_dict here (torch.save)")
    ap.add_argument("--logits", nargs=2, metavar=("IN", "OUT"), help="eval-mode logits of IN's images into OUT")
    args = ap.parse_args()
    check_outputs(args)
    meta, params, buffers = read_checkpoint(args.checkpoint)
    where = (f"epoch {meta['epoch']}" if meta["batch_in_epoch"] == 0
             else f"batch {meta['batch_in_epoch']} of epoch {meta['epoch'] + 1}")
    print(f"checkpoint {args.checkpoint}: format {meta['version']}, checksum ok | {meta['arch']} (norm "
          f"{meta['norm']}), {meta['n_params']} parameters, {meta['n_buffers']} buffer values | step "
          f"{meta['step']}, after {where} | trained by {meta['world_size']} rank(s), batch {meta['batch_size']}, "
          f"{meta['optimizer']}, {meta['data_source']} data, seed {meta['seed']}")
    if not args.out and not args.logits:
        return
    model = to_torch(meta, params, buffers, args.checkpoint)
    import torch
    if args.out:
        torch.save(model.state_dict(), args.out)
        print(f"saved {args.out}: ResNet({meta['arch']!r}, norm={meta['norm'] == 'bn'}).load_state_dict(torch.load(...))")
    if args.logits:
        src, dst = args.logits
        data = open(src, "rb").read()
        if len(data) % (4 * 3 * 32 * 32):
            fail(2, f"{src}: {len(data)} bytes is not a whole number of float32 [3][32][32] images")
        x = torch.frombuffer(bytearray(data), dtype=torch.float32).view(-1, 3, 32, 32)
        with torch.no_grad():  # in float64: the oracle's own rounding is then far below the C model's
            out = model.double()(x.double()).float()
        with open(dst, "wb") as f:
            f.write(array.array("f", out.flatten().tolist()).tobytes())
        print(f"wrote {dst}: logits of {x.shape[0]} images")


if __name__ == "__main__":
    main()
