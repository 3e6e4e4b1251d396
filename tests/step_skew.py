#!/usr/bin/env python3
"""step_skew.py — how long ranks wait for each other, step by step, from --trace files (Python 3
standard library only; tests/test_trace.c runs it).

    python3 tests/step_skew.py TRACE                 a stage 3-5 trace: its ranks, step by step
    python3 tests/step_skew.py TRACE TRACE [...]     single-process traces (stage 1 runs) paired step
                                                     by step: ranks that would run side by side

DDP's all-reduce makes every step go at the slowest rank's pace: in each step the other ranks
wait for it (so do DataParallel's replicas, at the gather; a stage 2 trace shows one per device). Steps
are matched by the optimizer step each device span records (args.step); a step in which some worker ran
nothing (a stage 2 replica beyond a short batch's chunks) is left out, and said. For each rank (or run) this prints its forward+backward per step — from the first
forward to the end of the backward on its compute lane; with accumulation, to the end of the step's
last backward, the K micro-batches of one optimizer step together — as median, standard deviation and 95th
percentile, then the wait: the mean over the steps of (the slowest rank's time - this rank's).
From several stage 1 runs, the same pairing says what two ranks with that much step-to-step
jitter would lose if nothing else differed: the gap between "mean of the slowest" and the slower
run's own mean is what the jitter alone costs.

--trace runs eager (no CUDA graphs: events are recorded around each stretch of ops), so absolute
times are eager's; the spread from step to step and between ranks is what this is for.
"""
import math
import os
import re
import statistics
import sys

import trace_file


def lanes(path):
    """{rank label: [forward+backward ms of each step]} from one trace file."""
    try:
        doc = trace_file.read(path)
    except trace_file.BadTrace as e:
        sys.exit(f"step_skew.py: {e}")
    try:
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
    except KeyError:
        sys.exit(f"step_skew.py: {path}: JSON, but not the trace events --trace writes (no \"traceEvents\") — "
                 f"give it the file a stage wrote with --trace")
    other = doc.get("otherData") if isinstance(doc, dict) else None
    window = other.get("trace_steps") if isinstance(other, dict) else None
    dropped = trace_file.dropped(other)
    if dropped:  # the steps that lost spans would be miscounted, or refused, with no word of the cause
        print(f"step_skew.py: warning: {path}: {dropped}", file=sys.stderr)
    try:
        return steps_of(path, events, window)
    except (KeyError, TypeError, AttributeError) as e:  # JSON, but not a trace-event file
        sys.exit(f"step_skew.py: {path}: JSON, but not the trace events --trace writes ({type(e).__name__}: {e}) — "
                 f"give it the file a stage wrote with --trace")


def steps_of(path, events, window):
    """{lane: {step: forward+backward ms}}: keyed by the optimizer step each device span records
    (args.step), so that lanes are compared step for step — a stage 2 replica given no chunk of a short
    last batch has no span in that step. Traces written before args.step: their steps in order."""
    # a hand-edited field of another type: what it is, not a TypeError deep in the sums (or a NaN time,
    # which reached statistics.pstdev and ended in a traceback)
    not_ours = f"step_skew.py: {path}: JSON, but not the trace events --trace writes"
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    for (pid, tid), name in names.items():
        if not isinstance(name, str):
            sys.exit(f"{not_ours} (lane pid {pid} tid {tid} is named {name!r}, not text) — give it the file a "
                     f"stage wrote with --trace")
    spans, steps = {}, {}
    for e in events:
        if e.get("ph") == "X" and e["name"] == "step":  # the optimizer steps, on each process's loop lane
            steps[e["pid"]] = steps.get(e["pid"], 0) + 1
        lane = names.get((e.get("pid"), e.get("tid")), "")
        if e.get("ph") == "X" and e["name"] in ("forward", "backward") and "compute" in lane:
            if not all(trace_file.is_number(e[k]) for k in ("ts", "dur")):
                sys.exit(f"{not_ours} (a {e['name']} span's ts {e['ts']!r} or dur {e['dur']!r} is not a finite "
                         f"number) — give it the file a stage wrote with --trace")
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            spans.setdefault((e["pid"], e["tid"]), {}).setdefault(e["name"], []).append(
                (e["ts"], e["dur"], args.get("step")))
    out = {}
    for (pid, tid), s in sorted(spans.items()):  # a lane per (process, thread id): two may share a name
        lane = names[(pid, tid)]
        fw, bw = sorted(s.get("forward", [])), sorted(s.get("backward", []))
        if not fw or len(fw) != len(bw):
            sys.exit(f"step_skew.py: {path}: {lane} has {len(fw)} forward and {len(bw)} backward spans")
        key = f"{path} pid {pid} tid {tid}: {lane}"
        if all(isinstance(x[2], int) for x in fw + bw):
            # accumulation (stage 4, 5): K forwards and backwards per optimizer step, and the ranks wait for
            # each other once a step, at the last one's all-reduce: a step is its K micro-batches together
            first, end = {}, {}
            for ts, dur, st in fw:
                first[st] = min(first.get(st, ts), ts)
            for ts, dur, st in bw:
                end[st] = max(end.get(st, ts + dur), ts + dur)
            out[key] = {st: (end[st] - first[st]) / 1e3 for st in first if st in end}
            continue
        n = steps.get(pid, 0)
        k = len(fw) // n if n and len(fw) % n == 0 else 1
        out[key] = {i // k: (bw[i + k - 1][0] + bw[i + k - 1][1] - fw[i][0]) / 1e3 for i in range(0, len(fw), k)}
    if not out and window and not any(e.get("ph") == "X" for e in events):  # written, but the run missed its window
        sys.exit(f"step_skew.py: {path}: no spans — the run ended before its --trace-steps {window} window, or "
                 f"was resumed past it: trace steps the run runs (--trace-steps A:B below its --steps)")
    if not out:
        sys.exit(f"step_skew.py: {path}: no forward/backward spans on a compute lane (was it made with --trace?)")
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n\n")[1])
    # A stage 3-5 trace FILE holds every rank, and FILE.rankN.json is rank N's copy of its part: given
    # both (a glob of the trace folder), or one file twice, each rank was counted as two workers.
    real = [os.path.realpath(p) for p in sys.argv[1:]]
    for i, p in enumerate(sys.argv[1:]):
        whole = re.fullmatch(r"(.+)\.rank([0-9]+)\.json", real[i])
        if real[i] in real[:i]:
            sys.exit(f"step_skew.py: {p} is given twice: give each trace once")
        if whole and whole.group(1) in real:
            sys.exit(f"step_skew.py: {p} is rank {whole.group(2)}'s part of {sys.argv[1 + real.index(whole.group(1))]}, "
                     f"which is given too and holds every rank: give that file alone")
    ranks = {}
    for p in sys.argv[1:]:
        ranks.update(lanes(p))
    if len(ranks) < 2:
        sys.exit("step_skew.py: one worker only (one rank, or stage 2 with one device): give a trace of several "
                 "ranks or devices, or several single-process ones")
    # the steps every worker ran: single-process traces (several stage 1 runs) pair their steps in order
    if len(sys.argv) > 2:
        ranks = {k: dict(enumerate(t[s] for s in sorted(t))) for k, t in ranks.items()}
    common = sorted(set.intersection(*(set(t) for t in ranks.values())))
    idle = len(set.union(*(set(t) for t in ranks.values()))) - len(common)
    if not common:
        sys.exit("step_skew.py: no step in which every worker ran a forward and backward: nothing to compare")
    steps = len(common)
    times = {k: [t[s] for s in common] for k, t in ranks.items()}
    slowest = [max(t[i] for t in times.values()) for i in range(steps)]
    print(f"{len(times)} workers (ranks, or stage 2's replicas), {steps} step{'' if steps == 1 else 's'}; "
          f"forward+backward per step, ms")
    if idle:
        print(f"  (left out: {idle} step{'' if idle == 1 else 's'} in which some worker had nothing to run — "
              f"stage 2's replicas beyond a short last batch's chunks)")
    for k, t in times.items():
        q = sorted(t)
        wait = statistics.mean(s - x for s, x in zip(slowest, t))
        print(f"  {k}: median {statistics.median(t):.3f} sd {statistics.pstdev(t):.3f} "
              f"p95 {q[math.ceil(0.95 * steps) - 1]:.3f} | waits for the others {wait:.3f} per step")
    worst = max(statistics.mean(t) for t in times.values())
    print(f"mean of the slowest per step {statistics.mean(slowest):.3f} ms; the slowest worker's own mean "
          f"{worst:.3f} ms: step-to-step jitter costs {statistics.mean(slowest) - worst:.3f} ms a step")


if __name__ == "__main__":
    main()
