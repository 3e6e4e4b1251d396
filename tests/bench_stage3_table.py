"""bench_stage3_table.py — the table and goals of tests/bench_stage3.sh, from the results it left.

    python3 tests/bench_stage3_table.py OUT MODE NGPU

OUT is the script's results folder (BENCH_OUT: the runs' JSONL reports, PyTorch's JSON lines and the
launcher check's files), MODE the words it ran the two-worker rows under ("2 GPUs", "2 workers on 1
GPU"), NGPU the GPUs it saw. It prints the table (step time, images/s, scaling, exposed
communication, TFLOP/s, peak memory per GPU), the launcher check, and with two GPUs where the second
GPU's cost goes and the goals. A file of its own rather than a heredoc in the script: the two-GPU
lines run only where two GPUs are lent, so tests/test_compare.c feeds it made-up results of such a run
on the CPU and checks the arithmetic; and a results folder can be read again without rerunning it.
"""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_flops as fl

if len(sys.argv) != 4 or not sys.argv[3].isdigit() or not os.path.isdir(sys.argv[1]):
    sys.exit("usage: python3 tests/bench_stage3_table.py OUT MODE NGPU — OUT the results folder of "
             "tests/bench_stage3.sh (BENCH_OUT), MODE its two-worker mode, NGPU the GPUs it saw")
out, mode, ngpu = sys.argv[1], sys.argv[2], int(sys.argv[3])
shared = ngpu < 2

def records(path, kind):
    try:
        return [json.loads(l) for l in open(path) if l.strip().startswith("{") and f'"type":"{kind}"' in l.replace(" ", "")]
    except OSError:
        return []

def last(path, kind="summary"):
    r = records(path, kind)
    return r[-1] if r else None

GiB = 2**30
s1, s1b, s3, s3n = (last(f"{out}/{n}.jsonl") for n in ("stage1", "stage1_again", "stage3", "stage3_nooverlap"))
if s1 and s1b:
    print(f"stage 1 measured twice: {s1['ms_per_iter_median']:.2f} and {s1b['ms_per_iter_median']:.2f} ms/iter; "
          "the faster is the scaling reference")
    s1 = min(s1, s1b, key=lambda r: r["ms_per_iter_median"])
c3, c3n = last(f"{out}/stage3.jsonl", "comm_summary"), last(f"{out}/stage3_nooverlap.jsonl", "comm_summary")
s3s, c3s = last(f"{out}/stage3_syncbn.jsonl"), last(f"{out}/stage3_syncbn.jsonl", "comm_summary")
pt1, ptd, ptds = last(f"{out}/pytorch1.json"), last(f"{out}/pytorch_ddp.json"), last(f"{out}/pytorch_ddp_syncbn.json")

def mem(r):
    p = r["peak_mem_bytes"]
    if len(p) == 1:
        return f"{p[0] / GiB:.2f} GiB"
    return f"{max(p) / GiB:.2f}/{min(p) / GiB:.2f} GiB ({max(p) / min(p):.3f})"

def eff(r, base):
    if not (r and base) or shared:
        return "n/a (1 GPU)" if shared and r and base else "-"
    return f"{100 * r['img_per_s'] / (r['world_size'] * base['img_per_s']):.1f}%"

def flops(r):  # a stage's own record; PyTorch's rows with stage 1's FLOPs per image and peak
    if "achieved_tflops" in r:
        return fl.stage(r)
    world = r.get("world_size", 1)
    return fl.like(s1, r["ms_per_iter_median"], world * r["batch_size"] * r.get("accum_steps", 1),
                   gpus=1 if shared else world)

def exposed(c):
    return f"{c['exposed_ms_median']:.3f} ms ({c['exposed_pct']:.1f}%)" if c else "-"

comm = "nccl" if not shared else "host"
rows = [("stage 1, one GPU", s1, None, None),
        (f"stage 3, {mode}, {comm}, overlap", s3, s1, c3),
        (f"stage 3, {mode}, {comm}, --no-overlap", s3n, s1, c3n),
        (f"stage 3, {mode}, {comm}, --sync-bn", s3s, s1, c3s)]
if pt1:
    rows.append((f"PyTorch {pt1['torch']}, one GPU", pt1, None, None))
if ptd:
    ptd.setdefault("world_size", len(ptd["peak_mem_bytes"]))
    rows.append((f"PyTorch DDP, {mode}, {ptd['backend']}", ptd, pt1, None))
if ptds:
    ptds.setdefault("world_size", len(ptds["peak_mem_bytes"]))
    rows.append((f"PyTorch DDP + SyncBatchNorm, {ptds['backend']}", ptds, pt1, None))

# torchrun --no-python ./stage3 against ./stage3's own launcher
a, b = records(f"{out}/check_launcher.jsonl", "step"), records(f"{out}/check_torchrun.jsonl", "step")
if not os.path.exists(f"{out}/check_torchrun.ran"):
    check = "torchrun --no-python ./stage3: not run (no PyTorch, so no torchrun)"
elif a and len(a) == len(b):
    diff = max(abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-30) for x, y in zip(a, b))
    check = (f"torchrun --no-python ./stage3, 2 workers ({mode}): {len(b)} steps, losses equal ./stage3's own "
             f"launcher's to {diff:.2g} (relative): " + ("PASS" if diff <= 1e-5 else "FAIL"))
else:
    check = f"torchrun --no-python ./stage3: FAIL ({len(a)} vs {len(b)} logged steps; see {out}/check_*.log)"

print()
print(f"{'ResNet-18, batch 128 per GPU, fp32':48s} {'ms/iter':>8s} {'img/s':>8s} {'scaling':>16s} {'exposed comm':>18s} "
      f"{fl.HEAD}  peak mem per GPU (max/min)")
for name, r, base, c in rows:
    if not r:
        print(f"{name:48s} {'failed':>8s}")
        continue
    print(f"{name:48s} {r['ms_per_iter_median']:8.2f} {r['img_per_s']:8.0f} {eff(r, base):>16s} {exposed(c):>18s} "
          f"{fl.cols(flops(r))}  {mem(r)}")
print("TFLOP/s: model FLOPs per step (conv + linear, forward + backward) over the median step; of peak: of the GPUs' "
      "dense peak for the convolutions' math (tests/bench_flops.py)" + (f", {s1['peak_tflops']} TFLOP/s per GPU "
      f"({s1['peak_math']}, {s1['peak_source']})" if s1 and s1.get("peak_tflops") else ""))
print(check)
if s3 and s3s:
    line = (f"SyncBatchNorm's price: stage 3 {s3['ms_per_iter_median']:.2f} -> {s3s['ms_per_iter_median']:.2f} ms/iter "
            f"({s3s['ms_per_iter_median'] / s3['ms_per_iter_median']:.2f}x: the exchanges, and no CUDA graphs)")
    if ptd and ptds:
        line += (f"; PyTorch DDP {ptd['ms_per_iter_median']:.2f} -> {ptds['ms_per_iter_median']:.2f} ms/iter "
                 f"({ptds['ms_per_iter_median'] / ptd['ms_per_iter_median']:.2f}x)")
    print(line)
s1g1, pr = last(f"{out}/stage1_gpu1.jsonl"), last(f"{out}/stage3.jsonl", "comm_per_rank")
if s1g1 and s1:
    print(f"stage 1 on the second GPU: {s1g1['ms_per_iter_median']:.2f} ms/iter (on the first: "
          f"{s1['ms_per_iter_median']:.2f}); DDP goes at the slower one's pace")
b0, b1 = last(f"{out}/stage1_both0.jsonl"), last(f"{out}/stage1_both1.jsonl")
if b0 and b1:
    print(f"stage 1 on both GPUs at once, independent runs: {b0['ms_per_iter_median']:.2f} / "
          f"{b1['ms_per_iter_median']:.2f} ms/iter (no communication: what two busy GPUs cost by themselves)")
one, pr1 = last(f"{out}/stage3_one.jsonl"), last(f"{out}/stage3_one.jsonl", "comm_per_rank")
if one and s1:
    print(f"stage 3 with one process (no peer): {one['ms_per_iter_median']:.2f} ms/iter, "
          f"{1e3 * (one['ms_per_iter_median'] - s1['ms_per_iter_median']):+.0f} us over stage 1 (DDP's marks, hooks, "
          "stream hops and graph splits alone)")
def ms(v):  # a rank's median; null where that rank timed no such step (the report's "n/a")
    return "n/a" if v is None else f"{v:.3f}"

if pr:
    print("stage 3 per rank, ms: forward+backward " + " / ".join(map(ms, pr["fwd_bwd_ms_per_rank"])) +
          " | waited after backward " + " / ".join(map(ms, pr["exposed_backward_ms_per_rank"])) +
          " | waited for buffers " + " / ".join(map(ms, pr["bcast_ms_per_rank"])))
# Where the two-GPU step's extra time goes, per rank: the machinery (one process against stage 1), the
# forward + backward stretched by the other rank's all-reduces running beside it (against the one-process
# run's), and the waits after backward and for the buffers (against the one-process run's two waits);
# the rest is unattributed. Each rank's parts add up to the step's extra time.
def per_rank_values(p):
    return list(zip(p["fwd_bwd_ms_per_rank"], p["exposed_backward_ms_per_rank"], p["bcast_ms_per_rank"]))

ranks, alone = (per_rank_values(pr), per_rank_values(pr1)) if pr and pr1 else ([], [])
if s3 and s1 and one and ranks and alone and not shared and None not in sum(ranks + alone, ()):  # null: n/a
    extra, mach = s3["ms_per_iter_median"] - s1["ms_per_iter_median"], one["ms_per_iter_median"] - s1["ms_per_iter_median"]
    fb1, ex1, bc1 = alone[0]
    parts = []
    for r, (fb, ex, bc) in enumerate(ranks):
        grow, wait = fb - fb1, (ex + bc) - (ex1 + bc1)
        parts.append(f"rank {r}: forward+backward {1e3 * grow:+.0f}, waits {1e3 * wait:+.0f}, "
                     f"rest {1e3 * (extra - mach - grow - wait):+.0f}")
    print(f"two-GPU cost over stage 1, us/step: {1e3 * extra:.0f} = machinery {1e3 * mach:.0f} + per rank (" +
          "; ".join(parts) + ")")
if s3 and s1 and c3 and not shared:
    e = s3["img_per_s"] / (s3["world_size"] * s1["img_per_s"])
    p = s3["peak_mem_bytes"]
    print(f"goals: scaling >= 97%: {'PASS' if e >= 0.97 else 'FAIL'} ({100 * e:.1f}%) | exposed comm <= 5% of the step: "
          f"{'PASS' if c3['exposed_pct'] <= 5 else 'FAIL'} ({c3['exposed_pct']:.1f}%) | memory max/min <= 1.05: "
          f"{'PASS' if max(p) / min(p) <= 1.05 else 'FAIL'} ({max(p) / min(p):.3f})")
elif shared:
    print("goals: scaling and exposed-communication goals need 2 GPUs; rerun this script on a 2-GPU machine")
