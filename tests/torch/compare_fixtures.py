"""compare_fixtures.py — a fixture made again against the committed one (tests/torch/regen_fixtures.sh).
    python3 tests/torch/compare_fixtures.py COMMITTED NEW
Exit 0 when the two files are byte for byte the same. Otherwise says where they differ — for the
FIXT0001 container (fixtures.py), record by record: names, types and shapes, then the number of
differing values and the largest difference; for text, the first differing lines — and exits 1.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fixtures  # noqa: E402


def main():
    old, new = sys.argv[1], sys.argv[2]
    a, b = open(old, "rb").read(), open(new, "rb").read()
    if a == b:
        return 0
    if a[:8] == b"FIXT0001" and b[:8] == b"FIXT0001":
        ra, rb = fixtures.read(old), fixtures.read(new)
        if list(ra) != list(rb):
            print(f"  records differ: only committed {sorted(set(ra) - set(rb))[:5]}, "
                  f"only new {sorted(set(rb) - set(ra))[:5]}")
        for name in ra:
            if name not in rb:
                continue
            x, y = ra[name], rb[name]
            if x.dtype != y.dtype or x.shape != y.shape:
                print(f"  {name}: {x.dtype}{list(x.shape)} committed, {y.dtype}{list(y.shape)} new")
            elif not np.array_equal(x, y, equal_nan=True):
                d = np.abs(x.astype(np.float64) - y.astype(np.float64))
                print(f"  {name}: {int(np.count_nonzero(~((x == y) | (np.isnan(x) & np.isnan(y)))))} of "
                      f"{x.size} values differ, largest difference {np.nanmax(d):.3g}")
    else:
        la, lb = a.decode(errors="replace").splitlines(), b.decode(errors="replace").splitlines()
        shown = 0
        for i in range(max(len(la), len(lb))):
            if (la[i] if i < len(la) else None) != (lb[i] if i < len(lb) else None):
                print(f"  line {i + 1}: committed {la[i] if i < len(la) else '(none)'!r}")
                print(f"  {' ' * len(str(i + 1))}       new {lb[i] if i < len(lb) else '(none)'!r}")
                shown += 1
                if shown == 3:
                    break
    return 1


if __name__ == "__main__":
    sys.exit(main())
