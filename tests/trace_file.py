"""trace_file.py — reads a --trace file for the trace tools (timeline.py, step_skew.py, trace_check.py).

One reader, so that each tool says the same thing of the same broken file: missing, empty (the
FILE.tmp a killed run leaves), cut short (a run that died writing it), binary, or not JSON — each
with its fix; and one test of a field that must be a number (a hand-edited file may hold any JSON
there), and one line for the spans the writer dropped. Python 3.6+, standard library only.
"""
import json
import math

GIVE = "give the file a stage's --trace FILE wrote"
RERUN = "the run that wrote it did not finish (interrupted or crashed; FILE.tmp is such a file): rerun it"


class BadTrace(Exception):
    """What is wrong with the file, and the fix: one line for the tool to print."""


def read(path):
    """The file's JSON document (the trace object, or a bare event array); BadTrace if it has none."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BadTrace(f"{path}: {e.strerror} — {GIVE}")
    if not data.strip():
        raise BadTrace(f"{path} is empty — {RERUN}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadTrace(f"{path} is not a trace (binary data, not JSON text) — {GIVE}")
    try:
        return json.loads(text)
    except RecursionError:
        raise BadTrace(f"{path} is not a trace (JSON nested too deeply) — {GIVE}")
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}: {e.msg}"
        if text.lstrip().startswith(("{", "[")):
            raise BadTrace(f"{path} is not complete JSON ({where}) — cut short: {RERUN}")
        raise BadTrace(f"{path} is not JSON ({where}) — {GIVE}")
    except ValueError as e:  # JSON, but what Python will not read: an integer of over 4300 digits
        raise BadTrace(f"{path} is not a trace ({e}) — {GIVE}")


def dropped(other):
    """What otherData.dropped (other: the trace's otherData) tells, as one line — the spans the writer had
    no room for, or a hand-edited value that is no count — or None when nothing was dropped."""
    n = other.get("dropped") if isinstance(other, dict) else None
    if n is None or n == 0 and type(n) is int:
        return None
    if type(n) is not int or n < 0:
        return f"otherData.dropped is {n!r}, not a count of spans — give the file a stage's --trace FILE wrote"
    return f"{n} spans were dropped (the writer's buffer was full): trace fewer steps"


def is_number(v):
    """A finite JSON number (a JSON true is none): math.isfinite alone raised OverflowError on an integer
    past any float (a hand-typed ts of 400 digits)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False
