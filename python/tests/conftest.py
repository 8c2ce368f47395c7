"""Fixtures of the Python tests: models written by `ferry gen`, and readers of the two formats
written from their specifications with the struct module (independent of ferry)."""
import json
import os
import struct
import subprocess
import tempfile

import numpy as np
import pytest

CLI = os.environ.get("FERRY_CLI", "ferry")
GEN_DIMS = ["--layers", "2", "--dim", "64", "--ff", "128", "--vocab", "256", "-q"]
# What `ferry gen` writes: f32, f16, bf16 in both formats, q8_0 and q4_0 in GGUF only.
MODELS = [(fmt, dt) for fmt in ("gguf", "safetensors") for dt in ("f32", "f16", "bf16")] + \
    [("gguf", "q8_0"), ("gguf", "q4_0")]


@pytest.fixture(scope="session")
def workdir():
    base = os.environ.get("FERRY_TEST_TMP")
    if base:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix="ferry-py-", dir=base)


def gen(out, *args):
    subprocess.run([CLI, "gen", "-o", out] + GEN_DIMS + list(args), check=True)
    return out


@pytest.fixture(scope="session")
def models(workdir):
    """(format, dtype) -> path of a small generated model."""
    out = {}
    for fmt, dt in MODELS:
        out[(fmt, dt)] = gen(os.path.join(workdir, "m_%s.%s" % (dt, fmt)), "--dtype", dt,
                             "--seed", "7")
    return out


# ---- safetensors: 8-byte little-endian header length, JSON header, data ---------------------
ST_NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
            "I16": "<i2", "I8": "i1", "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8",
            "BOOL": "?"}


def read_safetensors(path):
    """{name: (dtype name, shape, bytes)}, metadata dict or None."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, d in header.items():
        a, b = d["data_offsets"]
        out[name] = (d["dtype"], tuple(d["shape"]), blob[base + a:base + b])
    return out, meta


# ---- GGUF: header, key/values, tensor infos, aligned data ---------------------------------
# type id -> (elements per block, bytes per block), from ggml's type table
GGUF_TYPES = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18)}
GGUF_NAMES = {0: "f32", 1: "f16", 30: "bf16", 8: "q8_0", 2: "q4_0"}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}


def read_gguf(path):
    """{name: (type name, dims innermost first, bytes)}, {key: value}."""
    with open(path, "rb") as f:
        blob = f.read()
    pos = [0]

    def take(fmt):
        v = struct.unpack_from(fmt, blob, pos[0])
        pos[0] += struct.calcsize(fmt)
        return v[0]

    def string():
        n = take("<Q")
        s = blob[pos[0]:pos[0] + n].decode("utf-8")
        pos[0] += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(_SCALARS[t])

    assert blob[:4] == b"GGUF"
    pos[0] = 4
    take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("<I")
        dims = [take("<Q") for _ in range(nd)]
        infos.append((name, dims, take("<I"), take("<Q")))
    align = meta.get("general.alignment", 32)
    start = (pos[0] + align - 1) // align * align
    out = {}
    for name, dims, t, off in infos:
        be, bb = GGUF_TYPES[t]
        n = int(np.prod(dims)) if dims else 1
        out[name] = (GGUF_NAMES[t], tuple(dims), blob[start + off:start + off + n // be * bb])
    return out, meta


def reference(path):
    """{name: (dtype, shape outermost first, bytes)}, metadata: either format."""
    if path.endswith(".gguf"):
        t, meta = read_gguf(path)
        return {k: (d, tuple(reversed(s)), b) for k, (d, s, b) in t.items()}, meta
    t, meta = read_safetensors(path)
    return {k: (d.lower(), s, b) for k, (d, s, b) in t.items()}, meta


def in_use_bytes(m):
    """Host bytes of tensors still prepared: the host budget cut to 1 byte evicts everything else
    (ferry_set_budget keeps prepared tensors), then the default budget comes back."""
    m.set_budget("cpu", 1)
    try:
        return m.stats()["resident_bytes"][0]
    finally:
        m.set_budget("cpu", 0)
