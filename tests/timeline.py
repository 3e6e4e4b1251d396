#!/usr/bin/env python3
"""timeline.py — draw a --trace file as an SVG timeline (Python 3 standard library only).

    python3 tests/timeline.py TRACE.json OUT.svg [--title TEXT] [--width PX]
    make timeline TRACE=TRACE.json OUT=OUT.svg

One lane per thread / device stream, grouped by process (rank); nested spans stack downwards in
their lane; colours by what the span is (legend at the bottom); the optimizer steps of the window
are shaded bands across every lane, and the time axis is in milliseconds from the window's start.
Perfetto (ui.perfetto.dev) or chrome://tracing show the same file interactively; this picture is for
documents.

Bad input (a missing, empty, truncated or non-trace file, OUT naming the trace itself, a bad --width)
is one line "error: ..." saying what to do, exit status 2; spans that lack a field are skipped with a
warning and the rest is drawn, and so is a trace whose writer dropped spans (otherData.dropped), with a
warning that names it as tests/trace_check.py does.
"""
import argparse
import collections
import math
import os
import re
import stat
import sys
from xml.sax.saxutils import escape as sax_escape

import trace_file

USAGE = "python3 tests/timeline.py TRACE.json OUT.svg [--title TEXT] [--width PX]"
WIDTH_MIN, WIDTH_MAX = 400, 20000  # below: no room for the plot next to the lane names


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        die(f"{message} (usage: {USAGE})")


def escape(text):
    """Text for the SVG: &, <, > and " escaped; what XML 1.0 (or UTF-8) cannot hold dropped."""
    text = re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]", "", str(text))
    return sax_escape(text, {'"': "&quot;"})


# (legend label, colour) per kind of span; kind_of() maps a span to one of them
KINDS = collections.OrderedDict([
    ("forward", ("forward", "#4e79a7")),
    ("backward", ("backward", "#f28e2b")),
    ("optimizer", ("optimizer", "#59a14f")),
    ("comm", ("all-reduce / broadcast (communication)", "#17becf")),
    ("launch", ("DDP bucket launch (host)", "#1f5f6b")),
    ("copy", ("copies (H2D, peer)", "#9c755f")),
    ("dp", ("DataParallel phase (scatter, replicate, gather, reduce)", "#b07aa1")),
    ("gil_held", ("GIL held (Python running)", "#e15759")),
    ("gil_wait", ("GIL wait", "#f4c6c7")),
    ("planning", ("planning (plan-cache miss)", "#edc948")),
    ("input", ("input / loader", "#bab0ac")),
    ("wait", ("host thread waiting for other threads", "#dfe7f2")),
    ("other", ("other", "#d3d3d3")),
])


def kind_of(e):
    name, cat = e["name"], e.get("cat", "")
    if name.startswith("GIL held"):
        return "gil_held"
    if name.startswith("GIL wait"):
        return "gil_wait"
    if cat in ("loader", "input"):
        return "input"
    if cat in KINDS:
        return cat
    return "other"


def nice_step(span_ms, target=10):
    raw = span_ms / target
    if not raw > 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


is_num = trace_file.is_number  # finite, and no JSON true; an integer past any float is none


def order_key(v):
    """pids and tids sort as numbers, else as text (a hand-made trace may use names)."""
    return (0, v, "") if is_num(v) else (1, 0, str(v))


def check_paths(a):
    """TRACE a readable regular file, OUT writable and not the trace: the fix named, before any work."""
    if a.trace.lower().endswith(".svg"):
        die(f"{a.trace} is an SVG picture, not a trace — give the JSON file a stage's --trace wrote "
            f"(usage: {USAGE})")
    if os.path.splitext(a.out)[1].lower() == ".json":
        die(f"OUT {a.out} ends in .json: the picture would overwrite what may be a trace — give an .svg name "
            f"(usage: {USAGE})")
    try:
        st = os.stat(a.trace)
    except FileNotFoundError:
        die(f"{a.trace}: no such file — give the file a stage's --trace FILE wrote (e.g. ./stage1 --trace t.json)")
    except OSError as e:
        die(f"{a.trace}: {e.strerror} — give the file a stage's --trace FILE wrote")
    if stat.S_ISDIR(st.st_mode):
        die(f"{a.trace} is a directory — give the trace file in it (what --trace FILE named)")
    if not stat.S_ISREG(st.st_mode):
        die(f"{a.trace} is not a regular file — give the file a stage's --trace FILE wrote")
    if os.path.exists(a.out) and os.path.samefile(a.out, a.trace) or \
            os.path.realpath(a.out) == os.path.realpath(a.trace):
        die(f"OUT {a.out} is the trace itself: the picture would overwrite it — give another name, e.g. "
            f"{os.path.splitext(a.trace)[0]}.svg")
    out_dir = os.path.dirname(a.out) or "."
    if not os.path.isdir(out_dir):
        die(f"OUT {a.out}: directory '{out_dir}' does not exist (create it first: mkdir -p {out_dir})")
    if os.path.isdir(a.out):
        die(f"OUT {a.out} is a directory — give a file name, e.g. {os.path.join(a.out, 'timeline.svg')}")
    if os.path.exists(a.out) and not (os.path.isfile(a.out) or stat.S_ISCHR(os.stat(a.out).st_mode)):
        die(f"OUT {a.out} is not a regular file (a FIFO or socket) — give an .svg file name")
    if not os.access(out_dir, os.W_OK):
        die(f"OUT {a.out}: directory '{out_dir}' is not writable — give an .svg name in a writable directory")


def load(path):
    """The trace's events (a list of dicts) and what otherData.dropped says (trace_file.dropped: None when
    the writer dropped no span), or die naming what is wrong with the file."""
    try:
        doc = trace_file.read(path)
    except trace_file.BadTrace as e:
        die(str(e))
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc  # the object form, or the bare array
    if not isinstance(events, list):
        die(f"{path} is JSON but not a Chrome trace (no \"traceEvents\" list) — give the file a stage's "
            f"--trace FILE wrote")
    return events, trace_file.dropped(doc.get("otherData") if isinstance(doc, dict) else None)


def sane_span(e):
    """None if e is drawable, else why not."""
    for key in ("name", "ts", "dur"):
        if key not in e:
            return f'no "{key}"'
    if not is_num(e["ts"]) or not is_num(e["dur"]):
        return '"ts" or "dur" is not a finite number'
    if e["dur"] < 0:
        return 'negative "dur"'
    for key in ("pid", "tid"):
        if not isinstance(e.get(key, 0), (int, str)) or isinstance(e.get(key, 0), bool):
            return f'"{key}" is not a number or name'
    return None


def main():
    ap = Parser(usage=USAGE)
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    ap.add_argument("--width", type=int, default=1400)
    a = ap.parse_args()
    if not WIDTH_MIN <= a.width <= WIDTH_MAX:
        die(f"--width {a.width}: give the picture's width in pixels, {WIDTH_MIN} to {WIDTH_MAX} (default 1400)")
    check_paths(a)
    events, dropped = load(a.trace)
    if dropped:  # the picture would show a gap, or lanes ending early, with no word of why
        print(f"warning: {a.trace}: {dropped}; the picture lacks them", file=sys.stderr)

    pname, tname, torder, porder = {}, {}, {}, {}
    spans, skipped, why_skipped = [], 0, None
    for e in events:
        if not isinstance(e, dict):
            skipped += 1
            why_skipped = why_skipped or "an event that is not an object"
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        if e.get("ph") == "M":  # metadata: names and order of processes and lanes; a bad one is ignored
            key = (e.get("pid", 0), e.get("tid", 0))
            if not all(isinstance(k, (int, str)) and not isinstance(k, bool) for k in key):
                continue
            value = args.get("name"), args.get("sort_index")
            if e.get("name") == "process_name" and value[0] is not None:
                pname[key[0]] = str(value[0])
            elif e.get("name") == "process_sort_index" and is_num(value[1]):
                porder[key[0]] = value[1]
            elif e.get("name") == "thread_name" and value[0] is not None:
                tname[key] = str(value[0])
            elif e.get("name") == "thread_sort_index" and is_num(value[1]):
                torder[key] = value[1]
        elif e.get("ph") == "X":
            why = sane_span(e)
            if why:
                skipped += 1
                why_skipped = why_skipped or why
                continue
            spans.append({"name": str(e["name"]), "cat": e.get("cat") if isinstance(e.get("cat"), str) else "",
                          "ts": e["ts"], "dur": e["dur"], "pid": e.get("pid", 0), "tid": e.get("tid", 0),
                          "args": args})
    if skipped:
        print(f"warning: {a.trace}: {skipped} malformed event(s) skipped (the first: {why_skipped}); drawing the "
              f"rest", file=sys.stderr)
    if not spans and skipped:
        die(f"{a.trace}: none of its spans can be drawn (the first bad one: {why_skipped}) — it is not a file a "
            f"stage's --trace wrote; rerun the stage with --trace FILE")
    if not spans:
        die(f"{a.trace}: no spans to draw — did the run reach the --trace-steps window? (rerun with more --steps, "
            f"or an earlier --trace-steps A:B)")
    steps = [e for e in spans if e["name"] == "step"]
    spans = [e for e in spans if e["name"] != "step"] or steps  # steps are drawn as bands (and as spans if alone)
    t0 = min(e["ts"] for e in spans + steps)
    t1 = max(e["ts"] + e["dur"] for e in spans + steps)
    if not math.isfinite(t1 - t0):  # each time finite, the axis not: no picture has that width
        die(f"{a.trace}: its spans lie {t1 - t0} µs apart, past any float — it is not a file a stage's --trace "
            f"wrote; rerun the stage with --trace FILE")
    if t1 - t0 < 1:  # one instant (0-duration spans): a 1 µs axis, not a division by zero
        t1 = t0 + 1

    # lanes, and each span's depth in its lane (spans on a lane nest)
    lanes = collections.defaultdict(list)
    for e in spans:
        lanes[(e["pid"], e["tid"])].append(e)
    depth_of, lane_depth = {}, {}
    for key, ss in lanes.items():
        ss.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in ss:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            depth_of[id(e)] = len(stack)
            stack.append(e)
        lane_depth[key] = 1 + max(depth_of[id(e)] for e in ss)
    order = sorted(lanes, key=lambda k: (order_key(porder.get(k[0], k[0])), order_key(torder.get(k, k[1])),
                                         order_key(k[1]), order_key(k[0])))

    W, left, right = a.width, 250, 20
    row, gap, top = 13, 6, 58 if a.title else 40
    plot_w = W - left - right
    x_of = lambda t: left + (t - t0) / (t1 - t0) * plot_w
    y, lane_y, proc_y = top, {}, {}
    last_pid = None
    for key in order:
        if key[0] != last_pid:
            proc_y[key[0]] = y
            y += 18
            last_pid = key[0]
        lane_y[key] = y
        y += lane_depth[key] * row + gap
    plot_bottom = y
    legend_y = y + 34
    present = [k for k in KINDS if any(kind_of(e) == k for e in spans)]  # the legend lists what is drawn
    H = legend_y + 18 * ((len(present) + 2) // 3) + 10

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'font-family="DejaVu Sans, Arial, sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    if a.title:
        out.append(f'<text x="{left}" y="22" font-size="15" font-weight="bold">{escape(a.title)}</text>')
    # step bands
    for i, s in enumerate(sorted(steps, key=lambda e: (order_key(e["pid"]), e["ts"]))):
        if s["pid"] != order[0][0]:
            continue  # one process's steps give the bands
        xa, xb = x_of(s["ts"]), x_of(s["ts"] + s["dur"])
        out.append(f'<rect x="{xa:.1f}" y="{top - 4}" width="{xb - xa:.1f}" height="{plot_bottom - top + 4}" '
                   f'fill="{"#f3f3f3" if i % 2 == 0 else "#fafafa"}"/>')
        out.append(f'<line x1="{xa:.1f}" y1="{top - 14}" x2="{xa:.1f}" y2="{plot_bottom}" stroke="#999" '
                   f'stroke-dasharray="3,3"/>')
        out.append(f'<text x="{xa + 3:.1f}" y="{top - 6}" fill="#555">step {escape(s["args"].get("n", ""))}</text>')
    # time axis
    span_ms = (t1 - t0) / 1000
    step_ms = nice_step(span_ms)
    k = 0
    while k * step_ms <= span_ms + 1e-9:
        x = x_of(t0 + k * step_ms * 1000)
        out.append(f'<line x1="{x:.1f}" y1="{plot_bottom}" x2="{x:.1f}" y2="{plot_bottom + 5}" stroke="#333"/>')
        label = f"{k * step_ms:g}"
        out.append(f'<text x="{x:.1f}" y="{plot_bottom + 17}" text-anchor="middle">{label}</text>')
        k += 1
    out.append(f'<line x1="{left}" y1="{plot_bottom}" x2="{left + plot_w}" y2="{plot_bottom}" stroke="#333"/>')
    out.append(f'<text x="{left - 8}" y="{plot_bottom + 17}" text-anchor="end">ms</text>')
    # processes and lanes
    for pid, py in proc_y.items():
        out.append(f'<text x="6" y="{py + 13}" font-weight="bold">{escape(pname.get(pid, f"process {pid}"))}</text>')
        out.append(f'<line x1="6" y1="{py + 16}" x2="{W - right}" y2="{py + 16}" stroke="#bbb"/>')
    for key in order:
        ly = lane_y[key]
        out.append(f'<text x="16" y="{ly + 10}" fill="#333">{escape(tname.get(key, f"tid {key[1]}"))}</text>')
        out.append(f'<line x1="{left}" y1="{ly + lane_depth[key] * row + gap / 2:.1f}" x2="{W - right}" '
                   f'y2="{ly + lane_depth[key] * row + gap / 2:.1f}" stroke="#eee"/>')
        for e in lanes[key]:
            xa, xb = x_of(e["ts"]), x_of(e["ts"] + e["dur"])
            w = max(xb - xa, 0.6)
            yy = ly + depth_of[id(e)] * row
            colour = KINDS[kind_of(e)][1]
            args = e["args"]
            tip = f'{e["name"]}{" " + str(args["n"]) if "n" in args else ""}: {e["dur"] / 1000:.3f} ms'
            out.append(f'<rect x="{xa:.2f}" y="{yy}" width="{w:.2f}" height="{row - 1}" fill="{colour}" '
                       f'stroke="white" stroke-width="0.3"><title>{escape(tip)}</title></rect>')
            if w > 6.2 * len(e["name"]) + 4:
                out.append(f'<text x="{xa + 2:.1f}" y="{yy + row - 3}" font-size="9.5" fill="#111">'
                           f'{escape(e["name"])}</text>')
    # legend
    for i, (label, colour) in enumerate(KINDS[k] for k in present):
        lx, ly = left + (i % 3) * (plot_w // 3), legend_y + (i // 3) * 18
        out.append(f'<rect x="{lx}" y="{ly - 10}" width="14" height="11" fill="{colour}"/>')
        out.append(f'<text x="{lx + 19}" y="{ly}">{escape(label)}</text>')
    out.append(f'<text x="6" y="{legend_y}" fill="#555">time axis: ms from the</text>')
    out.append(f'<text x="6" y="{legend_y + 14}" fill="#555">window\'s first span</text>')
    out.append("</svg>")
    write(a.out, "\n".join(out) + "\n")
    print(f"timeline: {len(spans)} spans on {len(order)} lanes, {span_ms:.1f} ms -> {a.out}")


def write(path, text):
    """Into path.tmp, then renamed: a failed write leaves an earlier picture as it was (a device: in place)."""
    direct = os.path.exists(path) and not os.path.isfile(path)
    tmp = path if direct else path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        if not direct:
            os.replace(tmp, path)
    except OSError as e:
        if not direct and os.path.isfile(tmp):
            os.unlink(tmp)
        die(f"OUT {path}: cannot write {tmp} ({e.strerror}) — give an .svg name in a writable directory "
            f"with free space")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
