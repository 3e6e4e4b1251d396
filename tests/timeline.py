#!/usr/bin/env python3
"""timeline.py — draw a --trace file as an SVG timeline (Python 3 standard library only).

    python3 tests/timeline.py TRACE.json OUT.svg [--title TEXT] [--width PX]
    make timeline TRACE=TRACE.json OUT=OUT.svg

One lane per thread / device stream, grouped by process (rank); nested spans stack downwards in
their lane; colours by what the span is (legend at the bottom); the optimizer steps of the window
are shaded bands across every lane, and the time axis is in milliseconds from the window's start.
Perfetto (ui.perfetto.dev) or chrome://tracing show the same file interactively; this picture is for
documents.
"""
import argparse
import collections
import json
import sys
from xml.sax.saxutils import escape

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
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 10 ** -len(str(int(1 / raw)))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    ap.add_argument("--width", type=int, default=1400)
    a = ap.parse_args()
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]

    pname, tname, torder, porder = {}, {}, {}, {}
    for e in events:
        if e.get("ph") != "M":
            continue
        key = (e["pid"], e.get("tid", 0))
        if e["name"] == "process_name":
            pname[e["pid"]] = e["args"]["name"]
        elif e["name"] == "process_sort_index":
            porder[e["pid"]] = e["args"]["sort_index"]
        elif e["name"] == "thread_name":
            tname[key] = e["args"]["name"]
        elif e["name"] == "thread_sort_index":
            torder[key] = e["args"]["sort_index"]
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        sys.exit(f"{a.trace}: no spans to draw (did the run reach the --trace-steps window?)")
    steps = [e for e in spans if e["name"] == "step"]
    spans = [e for e in spans if e["name"] != "step"]  # steps are drawn as bands
    t0 = min(e["ts"] for e in spans + steps)
    t1 = max(e["ts"] + e["dur"] for e in spans + steps)

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
    order = sorted(lanes, key=lambda k: (porder.get(k[0], k[0]), torder.get(k, k[1]), k[1]))

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
    for i, s in enumerate(sorted(steps, key=lambda e: (e["pid"], e["ts"]))):
        if s["pid"] != order[0][0]:
            continue  # one process's steps give the bands
        xa, xb = x_of(s["ts"]), x_of(s["ts"] + s["dur"])
        out.append(f'<rect x="{xa:.1f}" y="{top - 4}" width="{xb - xa:.1f}" height="{plot_bottom - top + 4}" '
                   f'fill="{"#f3f3f3" if i % 2 == 0 else "#fafafa"}"/>')
        out.append(f'<line x1="{xa:.1f}" y1="{top - 14}" x2="{xa:.1f}" y2="{plot_bottom}" stroke="#999" '
                   f'stroke-dasharray="3,3"/>')
        out.append(f'<text x="{xa + 3:.1f}" y="{top - 6}" fill="#555">step {s.get("args", {}).get("n", "")}</text>')
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
            args = e.get("args", {})
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
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"timeline: {len(spans)} spans on {len(order)} lanes, {span_ms:.1f} ms -> {a.out}")


if __name__ == "__main__":
    main()
