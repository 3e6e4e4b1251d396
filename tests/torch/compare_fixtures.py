"""compare_fixtures.py — a fixture made again against the committed one (tests/torch/regen_fixtures.sh).
    python3 tests/torch/compare_fixtures.py COMMITTED NEW
Exit 0 when the two files are byte for byte the same. Otherwise says where they differ — for the
FIXT0001 container (fixtures.py), record by record: names, types and shapes, then the number of
differing values and the largest difference; for text, the first differing lines — and exits 1, or 2
when the difference is only another PyTorch build's: a text header line (#) naming another torch
version, or float64 values within 1e-12 of each other, relative (the last bits of another host's or
version's CPU kernels — the tests compare float32 results with these at 1e-5 or wider). A float32 or
16-bit record that differs at all, or any other line, is a real difference (1).
"""
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402

TORCH_VERSION = re.compile(r"torch \d+\.\d+\S*")


def main():
    old, new = sys.argv[1], sys.argv[2]
    a, b = open(old, "rb").read(), open(new, "rb").read()
    if a == b:
        return 0
    build_only = True  # every difference is another build's (exit 2), so far
    if a[:8] == b"FIXT0001" and b[:8] == b"FIXT0001":
        ra, rb = fixtures.read(old), fixtures.read(new)
        if list(ra) != list(rb):
            build_only = False
            print(f"  records differ: only committed {sorted(set(ra) - set(rb))[:5]}, "
                  f"only new {sorted(set(rb) - set(ra))[:5]}")
        for name in ra:
            if name not in rb:
                continue
            x, y = ra[name], rb[name]
            if x.dtype != y.dtype or x.shape != y.shape:
                build_only = False
                print(f"  {name}: {x.dtype}{list(x.shape)} committed, {y.dtype}{list(y.shape)} new")
            elif not np.array_equal(x, y, equal_nan=True):
                d = np.abs(x.astype(np.float64) - y.astype(np.float64))
                rounding = x.dtype == np.float64 and bool(np.all(np.nan_to_num(d) <= 1e-12 * np.maximum(1, np.abs(x))))
                build_only = build_only and rounding
                print(f"  {name}: {int(np.count_nonzero(~((x == y) | (np.isnan(x) & np.isnan(y)))))} of "
                      f"{x.size} values differ, largest difference {np.nanmax(d):.3g}"
                      f"{' (float64 rounding)' if rounding else ''}")
    else:
        la, lb = a.decode(errors="replace").splitlines(), b.decode(errors="replace").splitlines()
        shown = 0
        for i in range(max(len(la), len(lb))):
            if (la[i] if i < len(la) else None) != (lb[i] if i < len(lb) else None):
                # the same header line but for the torch version it names
                build_only = build_only and i < len(la) and i < len(lb) and la[i].startswith("#") and \
                    TORCH_VERSION.search(la[i]) is not None and \
                    TORCH_VERSION.sub("torch V", la[i]) == TORCH_VERSION.sub("torch V", lb[i])
                print(f"  line {i + 1}: committed {la[i] if i < len(la) else '(none)'!r}")
                print(f"  {' ' * len(str(i + 1))}       new {lb[i] if i < len(lb) else '(none)'!r}")
                shown += 1
                if shown == 3:
                    break
    return 2 if build_only else 1


if __name__ == "__main__":
    sys.exit(main())
