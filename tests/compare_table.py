"""compare_table.py — the table and chart of `make compare`, from the runs' JSON-lines reports.

    python3 tests/compare_table.py DIR        (DIR: what tests/compare.sh wrote; default runs/compare)

Reads DIR/plan.tsv (one line per run: name, stage, label, exit status, ms, command), DIR/meta.txt
(the setting), each run's DIR/NAME.jsonl ("summary" record; stage 2's "phases", stages 3–5's
"comm_summary") and PyTorch's DIR/pytorch*.json when present. Prints the table, and writes it as
DIR/compare.md and a chart, DIR/compare.svg (images/s per row; peak memory per device per row),
drawn here in plain SVG so that nothing beyond Python's standard library is needed.

Columns: ms per iteration (stage 4: per optimizer step of K micro-batches), images/s (every
device's images together), speed-up = images/s over stage 1's (the same per-device batch, so
this is the throughput ratio, not a ratio of step times; stage 1's faster run when it ran twice;
stage 2's rows: over stage 1 run NCHW without CUDA graphs, as stage 2 runs), peak memory per device (every byte the
trainer allocates; PyTorch: torch.cuda.max_memory_allocated), exposed communication per iteration
(stages 3–5: the time the compute stream waited for the all-reduce and buffer broadcast; stage 2:
its scatter + replicate + gather + reduce phases — the copies and the Python that drives them, all on the
critical path), achieved TFLOP/s (the
model's FLOPs per step over the median step: tests/bench_flops.py) and its fraction of the dense
peak of the GPUs the row ran on (n/a on the CPU backend). A timing the run could not take (too few
steps) is "n/a".
"""
import json
import math
import os
import re
import sys
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_flops as fl  # noqa: E402

# The original article's table (PyTorch, ResNet on 2 GPUs), for orientation only.
ARTICLE = [("one GPU", 420, [10.2]), ("DataParallel, 2 GPUs", 580, [14.5, 8.2]), ("DDP, 2 GPUs", 230, [10.5, 10.5])]


def records(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def last(recs, kind):
    r = [x for x in recs if x.get("type") == kind]
    return r[-1] if r else None


def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def nums(v):
    """The finite numbers of a list (peak_mem_bytes: one per device); [] for anything else (null)."""
    return [m for m in v if num(m) is not None] if isinstance(v, list) else []


def read_meta(d):
    meta = {}
    try:
        with open(os.path.join(d, "meta.txt")) as f:
            for line in f:
                k, _, v = line.rstrip("\n").partition("=")
                meta[k] = v
    except OSError:
        pass
    return meta


def load_rows(d):
    rows = []
    try:
        plan = [l.rstrip("\n").split("\t") for l in open(os.path.join(d, "plan.tsv")) if l.strip()]
    except OSError:
        plan = []
    for i, fields in enumerate(plan):  # a line cut short (a full disk) or a file from elsewhere
        if len(fields) != 6 or not fields[1].isdigit():
            sys.exit(f"compare: {os.path.join(d, 'plan.tsv')} line {i + 1} is not one that tests/compare.sh writes "
                     f"(name, stage, label, exit, ms, command): run make compare again")
    for name, stage, label, rc, ms, cmd in plan:
        recs = records(os.path.join(d, name + ".jsonl"))
        s = last(recs, "summary")
        row = {"name": name, "stage": int(stage), "label": label, "cmd": cmd, "ok": rc == "0" and s is not None, "rc": rc,
               "diverged": last(recs, "diverged"), "ms": None, "ips": None, "mem": [], "exposed": None, "exposed_kind": "", "device": "", "k": 1,
               "flops": (None, None), "summary": s}
        if s:
            row.update(ms=num(s.get("ms_per_iter_median")), ips=num(s.get("img_per_s")),
                       mem=nums(s.get("peak_mem_bytes")),
                       device=s.get("device", ""), k=num(s.get("accum_steps")) or 1, flops=fl.stage(s))
            if num(s.get("exposed_comm_ms_per_step")) is not None:
                row["exposed"], row["exposed_kind"] = s["exposed_comm_ms_per_step"], "waited"
            ph = last(recs, "phases")
            if ph and all(num(ph.get(k + "_ms")) is not None for k in ("scatter", "replicate", "gather", "reduce")):
                row["exposed"] = sum(ph[k + "_ms"] for k in ("scatter", "replicate", "gather", "reduce"))
                row["exposed_kind"] = "phases"  # the copies and their (modelled) Python
        rows.append(row)
    return rows


def load_pytorch(d, rows_ours, meta):
    """PyTorch's rows; their FLOPs per image and per-GPU peak are stage 1's (the same model, batch and
    math), on 1 GPU or, for DataParallel / DDP, on the GPUs the comparison ran on."""
    ref = next((r["summary"] for r in rows_ours if r["name"] in ("stage1", "stage1_again") and r["summary"]), None)
    if not (meta.get("gpus") or "1").isdigit():
        sys.exit(f"compare: {os.path.join(d, 'meta.txt')} says gpus={meta['gpus']}, not a count that tests/compare.sh "
                 f"writes: run make compare again")
    gpus = max(1, int(meta.get("gpus") or 1))
    rows = []
    for rec in records(os.path.join(d, "pytorch_dp.json")):
        if rec.get("type") != "summary":
            continue
        dp = rec.get("mode") == "dp"
        rows.append({"label": "PyTorch nn.DataParallel" if dp else "PyTorch, one GPU", "base": not dp, "rec": rec})
    for k in (1, 4):
        for rec in records(os.path.join(d, f"pytorch_ddp_k{k}.json")):
            if rec.get("type") == "summary":
                rows.append({"label": "PyTorch DDP" + (f" + accumulation (K={k}, no_sync)" if k > 1 else ""),
                             "base": False, "rec": rec})
    for r in rows:
        rec = r["rec"]
        r.update(ms=num(rec.get("ms_per_iter_median")), ips=num(rec.get("img_per_s")),
                 mem=nums(rec.get("peak_mem_bytes")), exposed=None, k=num(rec.get("accum_steps")) or 1)
        images = r["ips"] * r["ms"] / 1e3 if r["ips"] and r["ms"] else None
        r["flops"] = fl.like(ref, r["ms"], images, gpus=1 if r["base"] else gpus) if images else (None, None)
    return rows


def failed_text(r):
    """A row that did not finish: why (its report's "diverged" record, its exit code, or the missing
    summary), and where to look, so the table is not the end of the trail."""
    d = r.get("diverged")
    if isinstance(d, dict):
        why = f"diverged at step {d.get('step', '?')}"
    elif r.get("rc", "0") == "0":
        why = "no summary in its report"
    else:
        why = f"exit {r.get('rc')}"
    return f"failed ({why}: see {r.get('name', '?')}.log)"


def fmt_mem(b, unit):
    return "n/a" if b is None else f"{b / unit[1]:.2f}"


def mem_unit(rows):
    top = max([m for r in rows for m in r["mem"]] or [0])
    return ("GiB", 2**30) if top >= 2**30 else ("MiB", 2**20)


def table(rows, torch_rows, meta):
    """The table as a list of rows of cells (header first)."""
    ndev = max([len(r["mem"]) for r in rows + torch_rows] or [1])
    unit = mem_unit(rows + torch_rows)
    devname = "GPU" if meta.get("device") == "cuda" else "dev"
    head = ["run", "ms/iter", "images/s", "vs stage 1"] + [f"{devname}{i} peak ({unit[0]})" for i in range(ndev)] + \
        ["exposed comm (ms/iter)", "TFLOP/s", "of peak"]
    # stage 1's faster run (it runs first and, outside QUICK, again last) is the reference
    base = max([r["ips"] for r in rows if r["name"] in ("stage1", "stage1_again") and r["ips"]] or [0]) or None
    tbase = next((r["ips"] for r in torch_rows if r["base"] and r["ips"]), None)
    # stage 2 runs NCHW without CUDA graphs: its reference is stage 1 run the same way, when that row ran
    eager = next((r["ips"] for r in rows if r["name"] == "stage1_eager" and r["ips"]), None)
    out = [head]

    def line(r, base, ref):
        label = r["label"] + (f" (K={r['k']})" if r.get("k", 1) > 1 and "K=" not in r["label"] else "")
        if not r.get("ok", True):  # why, so the table is not the end of the trail
            return [label, failed_text(r)] + [""] * (len(head) - 2)
        ms = "n/a" if r["ms"] is None else f"{r['ms']:.2f}"
        ips = "n/a" if r["ips"] is None else f"{r['ips']:.0f}"
        up = "n/a" if r["ips"] is None or not base else f"{r['ips'] / base:.2f}× {ref}"
        mem = [fmt_mem(r["mem"][i] if i < len(r["mem"]) else None, unit) if r["mem"] else "n/a" for i in range(ndev)]
        mem = [m if i < len(r["mem"]) else "-" for i, m in enumerate(mem)]
        ex = "-" if r["exposed"] is None else f"{r['exposed']:.3f}" + (" (phases)" if r.get("exposed_kind") == "phases" else "")
        return [label, ms, ips, up] + mem + [ex] + list(fl.cells(r.get("flops", (None, None))))

    for r in rows:
        out.append(line(r, eager, "(of NCHW eager)") if r["stage"] == 2 and eager else line(r, base, ""))
    for r in torch_rows:
        out.append(line(r, tbase, "(of PyTorch's one GPU)"))
    return [[c.strip() for c in row] for row in out]


def print_table(t):
    w = [max(len(row[i]) for row in t) for i in range(len(t[0]))]
    for j, row in enumerate(t):
        print("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(row)))
        if j == 0:
            print("  ".join("-" * x for x in w))


def markdown(t):
    lines = ["| " + " | ".join(t[0]) + " |", "|" + "|".join(["---"] + ["---:"] * (len(t[0]) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in t[1:]]
    return "\n".join(lines)


def wrap_words(text, chars):
    """text in lines of at most `chars` characters, cut at spaces."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > chars:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return lines + ([line] if line else [])


def svg(rows, torch_rows, meta, notes=()):
    """Two panels: images/s per row (bars), peak memory per device per row (grouped bars). notes: what
    the times can and cannot show (the CPU backend's note, a one-GPU notice), drawn under the setting
    in red, so that the chart does not travel without them."""
    allr = rows + torch_rows  # a failed row keeps its line, saying so, as in the table
    okr = [r for r in allr if r.get("ok", True)]
    ndev = max([len(r["mem"]) for r in okr] or [1])
    unit = mem_unit(okr)
    colors = ["#4878a8", "#e0884a", "#6aa56a", "#c45a5a", "#8c6bb1", "#8d6e63", "#d277b5", "#7f7f7f"]
    rowh, left, pw, gap, label_w = 26, 330, 300, 60, 110  # label_w: room for a bar's "1.61 + 1.56"
    width = left + 2 * pw + gap + label_w
    sub, line = [], ""  # the setting, wrapped at commas to the chart's width (~6 px a character)
    for part in meta.get("setting", "").split(", "):
        if line and 6 * (len(line) + len(part) + 2) > width - 20:
            sub.append(line + ",")
            line = part
        else:
            line = f"{line}, {part}" if line else part
    sub.append(line)
    warn = [w for n in notes for w in wrap_words(n, (width - 20) // 6)]
    top = 50 + 14 * (len(sub) + len(warn))
    height = top + rowh * max(len(allr), 1) + 60
    ipsmax = max([r["ips"] or 0 for r in okr] or [1]) or 1
    memmax = max([m for r in okr for m in r["mem"]] or [1]) or 1
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{width}" height="{height}" fill="white"/>',
         f'<text x="10" y="20" font-size="15" font-weight="bold">{escape("make compare: " + meta.get("mode", ""))}</text>',
         *(f'<text x="10" y="{38 + 14 * i}" font-size="11" fill="#444">{escape(t)}</text>' for i, t in enumerate(sub)),
         *(f'<text x="10" y="{38 + 14 * (len(sub) + i)}" font-size="11" fill="#b22222">{escape(t)}</text>'
           for i, t in enumerate(warn)),
         f'<text x="{left}" y="{top - 8}" font-weight="bold">images/s (all devices)</text>',
         f'<text x="{left + pw + gap}" y="{top - 8}" font-weight="bold">peak memory per device ({unit[0]})</text>']
    for j, r in enumerate(allr):
        y = top + j * rowh
        if j % 2 == 0:
            o.append(f'<rect x="0" y="{y}" width="{width}" height="{rowh}" fill="#f4f4f4"/>')
        o.append(f'<text x="{left - 8}" y="{y + rowh / 2 + 4}" text-anchor="end">{escape(r["label"])}</text>')
        if not r.get("ok", True):
            text = failed_text(r)
            o.append(f'<text x="{left + 4}" y="{y + rowh / 2 + 4}" fill="#b22222">{escape(text)}</text>')
            continue
        if r["ips"]:
            w = pw * r["ips"] / ipsmax
            o.append(f'<rect x="{left}" y="{y + 5}" width="{w:.1f}" height="{rowh - 10}" fill="{colors[0]}"/>')
            o.append(f'<text x="{left + w + 4:.1f}" y="{y + rowh / 2 + 4}" font-size="11">{r["ips"]:.0f}</text>')
        else:
            o.append(f'<text x="{left + 4}" y="{y + rowh / 2 + 4}" fill="#888">n/a</text>')
        n = len(r["mem"])
        for i, m in enumerate(r["mem"]):
            bh = (rowh - 8) / max(n, 1)
            w = pw * m / memmax
            o.append(f'<rect x="{left + pw + gap}" y="{y + 4 + i * bh:.1f}" width="{w:.1f}" height="{bh - 1:.1f}" '
                     f'fill="{colors[(i + 1) % len(colors)]}"><title>device {i}: {m / unit[1]:.2f} {unit[0]}</title></rect>')
        if n:
            o.append(f'<text x="{left + pw + gap + pw * max(r["mem"]) / memmax + 4:.1f}" y="{y + rowh / 2 + 4}" '
                     f'font-size="11">{escape(" + ".join(f"{m / unit[1]:.2f}" for m in r["mem"]))}</text>')
    ly = top + rowh * len(allr) + 24
    for i in range(ndev):
        x = left + pw + gap + i * 80
        o.append(f'<rect x="{x}" y="{ly - 10}" width="12" height="12" fill="{colors[(i + 1) % len(colors)]}"/>')
        o.append(f'<text x="{x + 16}" y="{ly}">device {i}</text>')
    o.append(f'<text x="10" y="{ly + 22}" font-size="11" fill="#444">{escape(meta.get("command", "make compare"))} — '
             f'tests/compare_table.py</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def peak_note(rows):
    """' (tf32 494.7, fp16 989.4 TFLOP/s per GPU: NVIDIA H200 SXM datasheet, dense)', from the runs."""
    seen, src = {}, ""
    for r in rows:
        s = r.get("summary") or {}
        if num(s.get("peak_tflops")) and num(s.get("peak_devices")):
            seen.setdefault(s.get("peak_math"), s["peak_tflops"] / s["peak_devices"])
            src = src or s.get("peak_source", "")
    if not seen:
        return " (n/a here)"
    return " (" + ", ".join(f"{k} {v:.1f}" for k, v in seen.items()) + f" TFLOP/s per GPU: {src})"


def cpu_note(d, rows):
    """The stages' own one-line statement of what CPU timings show (printed by stages 2–5). Stage 2
    says its device threads share the cores, stages 3–5 their worker processes: the table's note
    names both when both ran."""
    notes, who = "", []
    for r in rows:
        try:
            for line in open(os.path.join(d, r["name"] + ".log")):
                if line.startswith("note: CPU backend — counts"):
                    notes = notes or line.strip()
                    m = re.search(r"the (device threads|worker processes) share", line)
                    if m and m.group(1) not in who:
                        who.append(m.group(1))
                    break
        except OSError:
            pass
    if len(who) > 1:
        notes = re.sub(r"the (device threads|worker processes) share",
                       "the device threads (stage 2) and worker processes (stages 3–5) share", notes)
    return notes


def drift_note(rows):
    """Stage 1 runs first and, outside QUICK, again last: two step times more than 10% apart mean the
    machine's speed changed under the comparison (other work on it, a throttled GPU), and every ratio
    against stage 1 carries that much doubt. Say so rather than print the ratios as if exact."""
    ms = {r["name"]: r["ms"] for r in rows if r["name"] in ("stage1", "stage1_again") and r["ms"]}
    if len(ms) < 2:
        return ""
    a, b = ms["stage1"], ms["stage1_again"]
    if max(a, b) <= 1.10 * min(a, b):
        return ""
    return (f"warning: stage 1 took {a:.2f} ms/iter first and {b:.2f} at the end ({max(a, b) / min(a, b):.2f}×): "
            "the machine's speed changed during the comparison (other work on it?), so the ratios carry that much "
            "doubt — run make compare again on an idle machine")


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "runs/compare"
    if not os.path.isdir(d):
        print(f"compare: {d} is not a folder: give the folder tests/compare.sh wrote (default runs/compare)")
        return 1
    meta = read_meta(d)
    rows = load_rows(d)
    torch_rows = load_pytorch(d, rows, meta)
    if not rows:
        print(f"compare: no runs in {d} (run tests/compare.sh first)")
        return 1
    t = table(rows, torch_rows, meta)
    note = cpu_note(d, rows) if meta.get("device") == "cpu" else ""
    print()
    print(f"compare: {meta.get('mode', '')} | {meta.get('setting', '')}")
    if meta.get("notice"):
        print("notice: " + meta["notice"])
    if note:
        print(note)
    print_table(t)
    drift = drift_note(rows)
    if drift:
        print(drift)
    if meta.get("missing"):
        print(f"(not in this checkout: stage {meta['missing']})")
    md = [f"# `{meta.get('command', 'make compare')}`", "",
          f"Machine: {meta.get('mode', '')}{' (' + meta['gpu'] + ')' if meta.get('gpu') else ''}.  ",
          f"Setting (every row): {meta.get('setting', '')}.", ""]
    if meta.get("notice"):
        md += [f"**Notice:** {meta['notice']}.", ""]
    if note:
        md += [f"**{note}**", ""]
    md += [markdown(t), ""] + ([f"**{drift}**", ""] if drift else []) + [
           "ms/iter: median step time after warm-up (stages 4–5 with accumulation: per optimizer step of K "
           "micro-batches). vs stage 1: images/s over stage 1's (its faster run) at the same per-device batch; stage 2's "
           "rows (of NCHW eager): over stage 1 run as stage 2 runs the model, NCHW without CUDA graphs. Exposed comm: "
           "stages 3–5, the time the compute stream waited for the all-reduce and buffer broadcast; stage 2 "
           "(phases), its scatter + replicate + gather + reduce phases: the copies and the Python that drives them "
           "(modelled under the GIL), all on the critical path. TFLOP/s: the model's FLOPs per "
           "step (conv + linear, forward + backward, 2 per multiply-add) over the median step; of peak: of the dense "
           "peak of the convolutions' math on the GPUs the row ran on" + peak_note(rows) + ".", ""]
    if meta.get("missing"):
        md += [f"Not in this checkout: stage {meta['missing']}.", ""]
    md += ["The article's table (PyTorch, 2 GPUs), for orientation:", "",
           "| | ms/iter | peak memory per GPU (GB) |", "|---|---:|---|"]
    md += [f"| {n} | {ms} | {' + '.join(str(m) for m in mem)} |" for n, ms, mem in ARTICLE]
    md += ["", "Chart: [compare.svg](compare.svg). Each row ran `./stageN FLAGS ROW_FLAGS --report NAME.jsonl`, FLAGS = "
           f"`{meta.get('flags', '')}`, ROW_FLAGS: " + "; ".join(f"`{r['cmd'].strip()}`" for r in rows) +
           " (logs and reports beside this file).", ""]
    with open(os.path.join(d, "compare.md"), "w") as f:
        f.write("\n".join(md))
    with open(os.path.join(d, "compare.svg"), "w") as f:
        f.write(svg(rows, torch_rows, meta, [n for n in ("notice: " + meta["notice"] if meta.get("notice") else "", note, drift) if n]))
    print(f"compare: table {os.path.join(d, 'compare.md')}, chart {os.path.join(d, 'compare.svg')} (opens in any browser), "
          f"logs and reports {d}/")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
