#!/usr/bin/env python3
"""trace_check.py — validate a --trace file (Python 3 standard library only; tests/test_trace.c runs it).

    python3 tests/trace_check.py FILE --steps A:B [--pids N] [--expect NAME ...]

Checks: the file is JSON of the form {"traceEvents": [...]}; every "X" event has name, cat, ph, ts,
dur >= 0, pid, tid, each of the writer's type (text, finite numbers, integers); every lane used has a thread_name and every pid a process_name ("M" events);
spans on one (pid, tid) lane nest — two spans either are disjoint or one contains the other, never
a partial overlap; host lanes are sorted (thread_sort_index) loop, replicas, autograd, communication,
loaders, each kind by number; the "step" spans are exactly steps A..B-1 on each process (the window); every
NAME given with --expect occurs. Prints one line per failure and exits 1, or "ok: ..." and exits 0.
"""
import argparse
import collections
import re
import sys

import trace_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--steps", required=True, help="A:B, as given to --trace-steps")
    ap.add_argument("--pids", type=int, default=1, help="processes (ranks) expected")
    ap.add_argument("--expect", nargs="*", default=[], help="span names that must occur")
    a = ap.parse_args()
    m = re.fullmatch(r"([0-9]+):([0-9]+)", a.steps)
    if not m or int(m.group(1)) >= int(m.group(2)):
        print(f"FAIL: --steps {a.steps!r} is not A:B with A < B (as given to --trace-steps, e.g. 5:8)")
        return 2
    first, end = int(m.group(1)), int(m.group(2))
    bad = []
    try:
        doc = trace_file.read(a.file)
    except trace_file.BadTrace as e:
        print(f"FAIL: {e}")
        return 1
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        print('FAIL: no "traceEvents" list')
        return 1
    lanes, procs, spans = set(), set(), []
    lane_name, lane_index = {}, {}
    def arg(e, key):  # e["args"][key], or None when the event lacks it
        args = e.get("args")
        return args.get(key) if isinstance(args, dict) else None

    def is_int(v):  # the writer's pids, tids, sort indices and step numbers (a JSON true is no 1)
        return isinstance(v, int) and not isinstance(v, bool)

    # A hand-edited file may hold any JSON where a field is expected: each wrong type is a FAIL line that
    # names the field, never a Python traceback (a lane named 5 stopped it at name.startswith).
    for e in events:
        if not isinstance(e, dict):
            bad.append(f"an entry of traceEvents is not an event object: {e!r}")
            continue
        ph = e.get("ph")
        if ph == "M":
            what = e.get("name")
            key = {"thread_name": "name", "thread_sort_index": "sort_index",
                   "process_name": "name"}.get(what) if isinstance(what, str) else None
            needs_tid = what != "process_name"
            value = arg(e, key) if key else None
            if not isinstance(what, str):
                bad.append(f"metadata event whose name is {what!r}, not text: {e}")
            elif key and (value is None or "pid" not in e or (needs_tid and "tid" not in e)):
                bad.append(f"metadata event without pid{', tid' if needs_tid else ''} or args.{key}: {e}")
            elif key and not (is_int(e["pid"]) and (not needs_tid or is_int(e["tid"]))):
                bad.append(f"{what} event whose pid{' or tid' if needs_tid else ''} is not an integer: {e}")
            elif key == "name" and not isinstance(value, str):
                bad.append(f"{what} event whose args.name is {value!r}, not text (a lane or process is named "
                           f"by a string): {e}")
            elif key == "sort_index" and not is_int(value):
                bad.append(f"thread_sort_index event whose args.sort_index is {value!r}, not an integer: {e}")
            elif what == "thread_name":
                lanes.add((e["pid"], e["tid"]))
                lane_name[(e["pid"], e["tid"])] = value
            elif what == "thread_sort_index":
                lane_index[(e["pid"], e["tid"])] = value
            elif what == "process_name":
                procs.add(e["pid"])
            continue
        if ph != "X":
            bad.append(f"unexpected event phase {ph!r}: {e}")
            continue
        missing = [k for k in ("name", "cat", "ts", "dur", "pid", "tid") if k not in e]
        if missing:
            bad.append(f"span without {missing}: {e}")
            continue
        if not (isinstance(e["name"], str) and isinstance(e["cat"], str)):
            bad.append(f"a span whose name or cat is not text: {e}")
            continue
        if not (is_int(e["pid"]) and is_int(e["tid"])):
            bad.append(f"a span whose pid or tid is not an integer: {e}")
            continue
        if not all(trace_file.is_number(e[k]) for k in ("ts", "dur")) or e["dur"] < 0:
            bad.append(f"bad ts/dur: {e}")
            continue
        if e["name"] == "step" and not is_int(arg(e, "n")):
            bad.append(f"a step span without its step number (args.n): {e}")
            continue
        spans.append(e)
    for e in spans:
        if (e["pid"], e["tid"]) not in lanes:
            bad.append(f"lane pid {e['pid']} tid {e['tid']} has no thread_name")
            break
    if len(procs) != a.pids:
        bad.append(f"{len(procs)} processes named, expected {a.pids}")

    # host lanes top to bottom: the loop, replicas, autograd, communication, loaders (eval ones last),
    # each kind by its number (loader worker 0 above 1)
    kinds = ["main", "replica", "autograd", "comm", "loader", "eval"]

    def rank_of(name):
        kind = next((i for i, k in enumerate(kinds) if name.startswith(k)), len(kinds))
        digits = re.search(r"[0-9]+", name)
        return kind, int(digits.group()) if digits else 0

    host = [(lane, lane_name[lane]) for lane in lane_name if lane[1] < 1000]
    for x, nx in host:
        for y, ny in host:
            if x[0] == y[0] and rank_of(nx) < rank_of(ny) and not lane_index.get(x, 0) < lane_index.get(y, 0):
                bad.append(f"pid {x[0]}: lane {nx!r} (sort index {lane_index.get(x)}) is not above {ny!r} "
                           f"(sort index {lane_index.get(y)})")

    # nesting per lane, in integer nanoseconds (the writer prints exact 3-decimal microseconds)
    by_lane = collections.defaultdict(list)
    for e in spans:
        t0 = round(e["ts"] * 1000)
        by_lane[(e["pid"], e["tid"])].append((t0, t0 + round(e["dur"] * 1000), e["name"]))
    for lane, ss in by_lane.items():
        ss.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for t0, t1, name in ss:
            while stack and stack[-1][1] <= t0:
                stack.pop()
            if stack and t1 > stack[-1][1]:
                bad.append(f"pid {lane[0]} tid {lane[1]}: {name!r} [{t0}, {t1}] ns partly overlaps "
                           f"{stack[-1][2]!r} [{stack[-1][0]}, {stack[-1][1]}] ns")
                break
            stack.append((t0, t1, name))

    # the window: each process has the step spans A..B-1 and nothing outside [first step, last step]
    dropped = trace_file.dropped(doc.get("otherData"))
    if dropped:
        bad.append(dropped)
    for pid in sorted(procs):
        steps = sorted(e["args"]["n"] for e in spans if e["pid"] == pid and e["name"] == "step")
        if steps != list(range(first, end)):
            bad.append(f"pid {pid}: step spans {steps}, expected {list(range(first, end))}")
    # nothing recorded before the window opened (spans may end after it closes: a loader's batch)
    for pid in sorted(procs):
        starts = [e["ts"] for e in spans if e["pid"] == pid and e["name"] == "step"]
        if not starts:
            continue
        early = [e for e in spans if e["pid"] == pid and e["ts"] < min(starts) - 1.0]
        if early:
            bad.append(f"pid {pid}: {len(early)} span(s) begin before the window, e.g. {early[0]}")
    names = {e["name"] for e in spans}
    for n in a.expect:
        if n not in names:
            bad.append(f"no span named {n!r} (have: {sorted(names)})")
    for b in bad:
        print("FAIL:", b)
    if bad:
        return 1
    print(f"ok: {len(spans)} spans on {len(by_lane)} lanes of {len(procs)} process(es), steps {first}..{end - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
