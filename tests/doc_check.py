#!/usr/bin/env python3
"""doc_check.py — the Markdown cannot rot: every relative link resolves, and every translation
holds the same skeleton as the page it translates.

    python3 tests/doc_check.py [ROOT] [--stages DIR]   (default ROOT: the repository this script is in)

It reads every *.md under ROOT (skipping runs/, data/ and dot-folders) and checks:

1. Links. Every relative link [text](target) outside code resolves: the file or folder exists, and a
   #anchor names a heading of the target page (GitHub's anchors: lower case, punctuation dropped,
   spaces to hyphens, "-1", "-2" for repeats). Web links (http:, https:, mailto:) are not fetched.
2. Twins. A page X.zh-CN.md translates X.md, and the two must agree on what is not prose: the same
   headings at the same levels in the same order; the same fenced code blocks in the same order with
   the same info string, byte for byte, except that comments in ```sh blocks (a line starting with #,
   or "  # ..." after a command) are translated; the same number of table rows; and each page links
   to the other. The tutorial test (tests/tutorial_test.sh) runs the tutorial's commands; this keeps
   every translation's commands, code and output in step with the English it came from.
3. Flags (with --stages DIR, the folder of the built ./stage1 … ./stage5). Every `./stageN` command
   on a page, in a code block or a code span, gives only flags that stage's --help lists, and every
   code span that starts with a flag (`--name`, `--name VALUE`) names a flag of some stage: a flag
   renamed or removed cannot live on in the lessons. A span like `--gil-*` names a family, and
   FOREIGN lists the other programs' flags the pages quote.
4. Bench commands against their logs. A code span quoting a script run (`STEPS=150 bash
   tests/bench_stage1.sh`, or `make bench`: the Makefile's recipe `bash tests/bench_stage1.sh`)
   followed, in the same paragraph, by a link to a log whose header (its leading # lines) names the
   command it ran: the step counts (STEPS=, SLOW_STEPS=, …) must be the log's, so the command a page
   gives is the one that made its figures.
5. Report records (where ROOT has common/ or stages/). Every `--report` record type the C code
   writes (`json_begin(r, "TYPE")`, or DDP's `report(d, "TYPE", …)`) is named as `TYPE` in the
   README's "What each run prints" section: a record a script may meet is never an undocumented one.

6. Logs. Every file in docs/logs is named (its file name) by a page, a script or a source: a log is
   kept to back a figure, and one that nothing cites any longer is clutter a reader cannot place.

It prints one line per problem, naming the file and line, and exits 1 if there is any.
"""
import os
import re
import subprocess
import sys
import unicodedata

SKIP_DIRS = {"runs", "data", "node_modules"}
FENCE = re.compile(r"^(```+|~~~+)(.*)$")
LINK = re.compile(r"(?<!\!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]*(?:\([^()]*\)[^()\s]*)*)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^()\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# A stage's command, to the end of its line (a trailing backslash continues it) or a |, ;, && or `.
STAGE_CMD = re.compile(r"\./stage([1-5])(?![\w.])((?:[^\n`|;&\\]|\\\n|\\)*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
SPAN_FLAG = re.compile(r"`(--[a-z][a-z0-9-]*)")
HELP_FLAG = re.compile(r"^\s+(--[a-z][a-z0-9-]*)", re.M)
# Flags of other programs that the pages quote in a code span of their own.
FOREIGN = {"--kernel-name-exclude": "compute-sanitizer"}
# A script run quoted in a code span (it may wrap), and a link to a log; the step counts compared.
BENCH_SPAN = re.compile(r"`((?:[A-Z][A-Z0-9_]*=[^\s`]+\s+)*)(?:bash\s+(tests/[\w.-]+\.sh)[^`]*|"
                        r"make\s+([\w-]+)((?:\s+[A-Z][A-Z0-9_]*=[^\s`]+)*))`")
MAKE_RULE = re.compile(r"^([\w-]+):[^\n=]*\n\t(?:@)?bash\s+(tests/[\w.-]+\.sh)\s*$", re.M)
LOG_LINK = re.compile(r"\]\(([^()\s]*logs/[^()\s#]+)\)")
STEP_VAR = re.compile(r"^(?:\w+_)?STEPS$")
# A --report record type as the code writes it: json_begin's literal, or the type ddp.c's report() passes on.
RECORD = re.compile(r'\bjson_begin\([^,()]+,\s*"(\w+)"\)|\breport\(d,\s*"(\w+)"')
RECORDS_SECTION = "What each run prints"


def md_files(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x not in SKIP_DIRS)
        for f in sorted(files):
            if f.endswith(".md"):
                yield os.path.join(d, f)


def parse(path):
    """The page's lines outside fences, its headings, its fenced blocks and its table rows."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    prose, headings, blocks, tables = [], [], [], 0
    fence = None
    for no, line in enumerate(lines, 1):
        m = FENCE.match(line.strip()) if line.startswith(("```", "~~~")) else None
        if fence is None:
            if m:
                fence = {"mark": m.group(1), "info": m.group(2).strip(), "line": no, "body": []}
                continue
            prose.append((no, line))
            h = HEADING.match(line)
            if h:
                headings.append((no, len(h.group(1)), h.group(2)))
            elif line.lstrip().startswith("|"):
                tables += 1
        elif m and m.group(1).startswith(fence["mark"]) and not m.group(2).strip():
            blocks.append(fence)
            fence = None
        else:
            fence["body"].append(line)
    if fence is not None:
        raise ValueError(f"line {fence['line']}: a code fence that is never closed")
    return prose, headings, blocks, tables


def slug(text):
    """GitHub's anchor for a heading: the rendered text, lower case, letters / digits / marks /
    '-' / '_' kept, spaces to hyphens, everything else dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = text.replace("`", "").replace("*", "")
    out = []
    for ch in text.lower():
        if ch == " ":
            out.append("-")
        elif ch in "-_" or unicodedata.category(ch)[0] in "LNM":
            out.append(ch)
    return "".join(out)


def anchors(headings):
    seen, out = {}, set()
    for _, _, text in headings:
        s = slug(text)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def without_code_spans(line):
    return re.sub(r"(`+)(?:(?!\1).)+\1", lambda m: " " * len(m.group(0)), line)


def check_links(root, path, prose, pages, problems):
    rel = os.path.relpath(path, root)
    for no, line in prose:
        text = without_code_spans(line)
        targets = [m.group(2) for m in LINK.finditer(text)] + [m.group(1) for m in IMAGE.finditer(text)]
        for target in targets:
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # web and mail links are not fetched
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                problems.append(f"{rel}:{no}: link to {target}: {os.path.relpath(dest, root)} does not exist")
                continue
            if anchor and dest.endswith(".md"):
                page = pages.get(dest)
                if page is not None and anchor not in page[4]:
                    problems.append(f"{rel}:{no}: link to {target}: no heading of "
                                    f"{os.path.relpath(dest, root)} has the anchor #{anchor}")


def sh_commands(body):
    """A ```sh block without its comments: what must match between the languages."""
    out = []
    for line in body:
        if line.lstrip().startswith("#"):
            continue
        out.append(re.sub(r"\s+# .*$", "", line).rstrip())
    return out


def links_to(prose, path, other):
    want = os.path.normpath(other)
    for _, line in prose:
        for m in LINK.finditer(without_code_spans(line)):
            file = m.group(2).partition("#")[0]
            if file and os.path.normpath(os.path.join(os.path.dirname(path), file)) == want:
                return True
    return False


def check_twin(root, en, zh, pages, problems):
    e, z = pages[en], pages[zh]
    er, zr = os.path.relpath(en, root), os.path.relpath(zh, root)
    # headings: level by level, in order
    el = [lvl for _, lvl, _ in e[1]]
    zl = [lvl for _, lvl, _ in z[1]]
    if el != zl:
        for i, (a, b) in enumerate(zip(e[1] + [None] * len(zl), z[1] + [None] * len(el))):
            if a is None or b is None or a[1] != b[1]:
                where = (f"{er}:{a[0]} '{'#' * a[1]} {a[2]}'" if a else f"{er}: none") + " vs " + \
                        (f"{zr}:{b[0]} '{'#' * b[1]} {b[2]}'" if b else f"{zr}: none")
                problems.append(f"{zr}: headings differ from {er} at heading {i + 1}: {where}")
                break
    # code blocks
    if len(e[2]) != len(z[2]):
        problems.append(f"{zr}: {len(z[2])} code blocks, {er} has {len(e[2])}: a translation holds the same ones")
    for a, b in zip(e[2], z[2]):
        if a["info"] != b["info"]:
            problems.append(f"{zr}:{b['line']}: code block opens ```{b['info']}, "
                            f"{er}:{a['line']} opens ```{a['info']}")
            continue
        lang = a["info"].split()[0] if a["info"] else ""
        same = (sh_commands(a["body"]) == sh_commands(b["body"])) if lang == "sh" else a["body"] == b["body"]
        if not same:
            what = "its commands" if lang == "sh" else "its text (only sh comments may be translated)"
            problems.append(f"{zr}:{b['line']}: code block differs from {er}:{a['line']} in {what}")
    if e[3] != z[3]:
        problems.append(f"{zr}: {z[3]} table rows, {er} has {e[3]}")
    if not links_to(e[0], en, zh):
        problems.append(f"{er}: does not link to its translation {os.path.basename(zh)}")
    if not links_to(z[0], zh, en):
        problems.append(f"{zr}: does not link back to {os.path.basename(en)}")


def stage_flags(stages):
    """Each stage's flags, from its --help (None when a stage is not built there)."""
    flags = {}
    for n in range(1, 6):
        exe = os.path.join(stages, f"stage{n}")
        if not os.access(exe, os.X_OK):
            return None
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60).stdout
        flags[n] = set(HELP_FLAG.findall(out)) | {"--help"}
        if len(flags[n]) < 10:
            raise SystemExit(f"doc_check: {exe} --help listed {len(flags[n])} flags: not a stage's help")
    return flags


def check_flags(root, path, flags, problems):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    rel = os.path.relpath(path, root)
    every = set().union(*flags.values())
    for m in STAGE_CMD.finditer(text):
        n = int(m.group(1))
        for fm in FLAG.finditer(m.group(2)):
            if fm.group(1) not in flags[n]:
                line = text.count("\n", 0, m.start(2) + fm.start()) + 1
                problems.append(f"{rel}:{line}: ./stage{n} has no flag {fm.group(1)} (./stage{n} --help lists them)")
    for m in SPAN_FLAG.finditer(text):
        flag = m.group(1)
        if flag not in every and flag not in FOREIGN and not flag.endswith("-"):
            line = text.count("\n", 0, m.start()) + 1
            problems.append(f"{rel}:{line}: `{flag}` is no stage's flag")


def step_counts(words):
    """The step-count assignments (STEPS=150, MEM_STEPS=10) among a command's VAR=VALUE words."""
    pairs = (w.split("=", 1) for w in words.split())
    return {k: v for k, v in pairs if STEP_VAR.match(k)}


def log_command(path, script):
    """The step counts of `… bash SCRIPT` as the log's header names it, or None (no such header)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.startswith("#"):
                return None
            m = re.search(r"((?:[A-Z][A-Z0-9_]*=\S+\s+)*)bash\s+" + re.escape(script) + r"\b", line)
            if m:
                return step_counts(m.group(1))
    return None


def make_scripts(root):
    """Each make target whose recipe is one `bash tests/X.sh`, to that script."""
    try:
        with open(os.path.join(root, "Makefile"), encoding="utf-8") as f:
            return dict(MAKE_RULE.findall(f.read()))
    except OSError:
        return {}


def check_bench_commands(root, path, prose, problems, targets):
    rel = os.path.relpath(path, root)
    paragraphs, cur = [], []
    for no, line in prose + [(None, "")]:
        if line.strip():
            cur.append((no, line))
        elif cur:
            paragraphs.append(cur)
            cur = []
    for para in paragraphs:
        text = "\n".join(line for _, line in para)
        spans = list(BENCH_SPAN.finditer(text))
        for i, m in enumerate(spans):
            end = spans[i + 1].start() if i + 1 < len(spans) else len(text)
            link = LOG_LINK.search(text, m.end(), end)  # this command's log: before the next command
            if not link:
                continue
            script = m.group(2) or targets.get(m.group(3))
            log = os.path.normpath(os.path.join(os.path.dirname(path), link.group(1)))
            ran = log_command(log, script) if script and os.path.isfile(log) else None
            if ran is None:
                continue
            quoted = step_counts(m.group(1) + " " + (m.group(4) or ""))
            if quoted != ran:
                no = para[0][0] + text.count("\n", 0, m.start())
                want = " ".join(f"{k}={v}" for k, v in sorted(ran.items())) or "no step count (the default)"
                problems.append(f"{rel}:{no}: `{' '.join(m.group(0)[1:-1].split())}` — its log "
                                f"{os.path.basename(log)} ran it with {want}")


def record_types(root):
    """Each --report record type the C sources under ROOT write, with the first file that writes it."""
    types = {}
    for sub in ("common", "stages"):
        for d, dirs, files in os.walk(os.path.join(root, sub)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith((".c", ".cu")):
                    path = os.path.join(d, f)
                    with open(path, encoding="utf-8", errors="replace") as fh:
                        for m in RECORD.finditer(fh.read()):
                            types.setdefault(m.group(1) or m.group(2), os.path.relpath(path, root))
    return types


def check_records(root, pages, problems):
    types = record_types(root)
    if not types:
        return  # no C sources here (a test's folder of pages)
    readme = os.path.join(root, "README.md")
    if readme not in pages:
        problems.append(f"README.md: missing, and the code writes --report records ({', '.join(sorted(types))})")
        return
    prose, headings = pages[readme][0], pages[readme][1]
    start = next(((no, lvl) for no, lvl, text in headings if text == RECORDS_SECTION), None)
    if start is None:
        problems.append(f"README.md: no '{RECORDS_SECTION}' section, where the --report record types are listed")
        return
    end = next((no for no, lvl, _ in headings if no > start[0] and lvl <= start[1]), float("inf"))
    named = set()
    for no, line in prose:
        if start[0] < no < end:
            named.update(re.findall(r"`\"?(\w+)\"?`", line))
    for t, where in sorted(types.items()):
        if t not in named:
            problems.append(f"README.md:{start[0]}: the --report record `{t}` ({where} writes it) is not named "
                            f"under '{RECORDS_SECTION}'")


CITING = (".md", ".sh", ".py", ".c", ".h", ".cu")


def check_logs(root, problems):
    logs = os.path.join(root, "docs", "logs")
    if not os.path.isdir(logs):
        return
    names = sorted(f for f in os.listdir(logs) if os.path.isfile(os.path.join(logs, f)))
    text = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith(".") and
                         os.path.join(d, x) != logs)  # a log does not cite itself
        for f in sorted(files):
            if f.endswith(CITING) or f == "Makefile":
                with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
                    text.append(fh.read())
    text = "\n".join(text)
    for name in names:
        if name not in text:
            problems.append(f"docs/logs/{name}: no page, script or source names it (cite it where it backs a "
                            f"figure, or remove it)")


def main():
    # The default is the checkout this script is in, found through links (the sanitizer builds run the
    # tests from a folder that links to tests/, stages/ and docs/ but holds no README.md).
    here = os.path.dirname(os.path.realpath(__file__))
    args = sys.argv[1:]
    stages = None
    if "--stages" in args:
        i = args.index("--stages")
        if i + 1 >= len(args):
            raise SystemExit("doc_check: --stages needs the folder that holds ./stage1 … ./stage5")
        stages = args[i + 1]
        del args[i : i + 2]
    root = os.path.abspath(args[0] if args else os.path.join(here, ".."))
    flags = stage_flags(stages) if stages else None
    if stages and flags is None:
        raise SystemExit(f"doc_check: --stages {stages}: ./stage1 … ./stage5 are not all built there (make all)")
    problems, pages, targets = [], {}, make_scripts(root)
    for path in md_files(root):
        try:
            prose, headings, blocks, tables = parse(path)
        except (ValueError, UnicodeDecodeError) as err:
            problems.append(f"{os.path.relpath(path, root)}: {err}")
            continue
        pages[path] = (prose, headings, blocks, tables, anchors(headings))
    for path, page in pages.items():
        check_links(root, path, page[0], pages, problems)
        check_bench_commands(root, path, page[0], problems, targets)
        if flags:
            check_flags(root, path, flags, problems)
    check_records(root, pages, problems)
    check_logs(root, problems)
    twins = 0
    for path in pages:
        if path.endswith(".zh-CN.md"):
            en = path[: -len(".zh-CN.md")] + ".md"
            if en not in pages:
                problems.append(f"{os.path.relpath(path, root)}: a translation of {os.path.basename(en)}, "
                                f"which does not exist")
                continue
            check_twin(root, en, path, pages, problems)
            twins += 1
    for p in problems:
        print("FAIL:", p)
    checked = ", flags checked against ./stage1 … ./stage5 --help" if flags else ""
    print(f"doc_check: {len(pages)} pages, {twins} translations, {len(problems)} problems{checked}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
