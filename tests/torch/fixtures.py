"""fixtures.py — the small binary container the C tests read (tests/test_fixtures.c).

File: b"FIXT0001", then records: u32 name length, name bytes, u32 dtype (0 float32, 1 float64,
2 int64, 3 int32), u32 ndim, u32 dims[ndim], raw little-endian data. Nothing else, so the C
reader stays twenty lines.
"""
import struct

import numpy as np

DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.int64): 2, np.dtype(np.int32): 3}


def write(path, records):
    with open(path, "wb") as f:
        f.write(b"FIXT0001")
        for name, arr in records.items():
            arr = np.ascontiguousarray(arr)
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", DTYPES[arr.dtype], arr.ndim))
            f.write(struct.pack("<%dI" % arr.ndim, *arr.shape))
            f.write(arr.astype(arr.dtype.newbyteorder("<")).tobytes())


def read(path):
    """The records of a fixture file, in order: {name: array}."""
    codes = {v: k for k, v in DTYPES.items()}
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"FIXT0001":
        raise ValueError(f"{path}: not a fixture file (no FIXT0001 header)")
    out, at = {}, 8
    while at < len(data):
        (ln,) = struct.unpack_from("<I", data, at)
        name = data[at + 4:at + 4 + ln].decode()
        at += 4 + ln
        code, ndim = struct.unpack_from("<II", data, at)
        shape = struct.unpack_from("<%dI" % ndim, data, at + 8)
        at += 8 + 4 * ndim
        dt = codes[code].newbyteorder("<")
        count = int(np.prod(shape)) if ndim else 1
        out[name] = np.frombuffer(data, dt, count, at).reshape(shape)
        at += count * dt.itemsize
    return out
