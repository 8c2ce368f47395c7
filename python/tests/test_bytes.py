"""Every array ferry hands out equals the file's bytes, read independently (conftest.py), for every
dtype `ferry gen` writes, in both formats, in every home and load mode."""
import numpy as np
import pytest

import ferry
from conftest import MODELS, reference

NUMPY = {"f32": np.float32, "f16": np.float16}
RAW = {"bf16": np.uint16}


def check_array(a, name, want):
    dtype, shape, raw = want
    assert isinstance(a, ferry.Array), name
    if dtype in NUMPY:
        assert a.dtype == NUMPY[dtype] and a.shape == shape, (name, a.dtype, a.shape, shape)
    elif dtype in RAW:
        assert a.dtype == RAW[dtype] and a.shape == shape, (name, a.dtype, a.shape)
        assert a.ferry_dtype == dtype
    else:  # quantized: raw bytes of each row
        assert a.dtype == np.uint8 and a.shape[:-1] == shape[:-1], (name, a.shape, shape)
        assert a.ferry_dtype == dtype
    assert np.ascontiguousarray(a).tobytes() == raw, name


@pytest.mark.parametrize("fmt,dt", MODELS)
@pytest.mark.parametrize("home", ["host", "disk", "device"])
@pytest.mark.parametrize("load", ["auto", "mmap", "read", "direct"])
def test_every_home_and_load(models, fmt, dt, home, load):
    path = models[(fmt, dt)]
    want, _ = reference(path)
    with ferry.Manager(host_budget="32MiB") as m:
        m.open(path)
        m.group("all", "*", home=home, load=load, lazy=False)
        names = m.keys()
        assert sorted(names) == sorted(want)
        for _ in range(2):  # a second pass finds cached copies (home disk) or kept ones
            with m.prepared(names) as ts:
                for name, a in ts.items():
                    check_array(a, name, want[name])
                    if home == "host" and load == "mmap":
                        assert not a.flags.writeable, "a zero-copy mapping is read-only"


@pytest.mark.parametrize("fmt,dt", MODELS)
def test_lazy_tensors_and_read_rows(models, fmt, dt):
    path = models[(fmt, dt)]
    want, _ = reference(path)
    with ferry.Manager() as m:
        m.open(path)
        m.group("lazy", "*", lazy=True)
        with m.prepared("token_embd.weight") as ts:
            check_array(ts[0], "token_embd.weight", want["token_embd.weight"])
        dtype, shape, raw = want["token_embd.weight"]
        row_bytes = len(raw) // shape[0]
        rows = [5, 0, 5, 255, 17]
        got = m.read_rows("token_embd.weight", rows)
        assert got.flags.writeable and got.shape[0] == len(rows)
        assert got.tobytes() == b"".join(raw[r * row_bytes:(r + 1) * row_bytes] for r in rows)


def test_sim_device_tensors_copy_back(models):
    path = models[("gguf", "f16")]
    want, _ = reference(path)
    with ferry.Manager(devices=["sim:64MiB"]) as m:
        m.open(path)
        m.group("blk", "blk.*", home="host", compute_device="sim:64MiB")
        with m.prepared(["blk.0.attn_q.weight", "output_norm.weight"]) as ts:
            dev, host = ts
            assert isinstance(dev, ferry.DeviceTensor) and dev.data_ptr
            assert dev.numpy().tobytes() == want["blk.0.attn_q.weight"][2]
            check_array(host, "output_norm.weight", want["output_norm.weight"])


@pytest.mark.parametrize("src", ["f16", "bf16"])
def test_converted_copies(models, src):
    path = models[("safetensors", src)]
    want, _ = reference(path)
    with ferry.Manager() as m:
        m.open(path)
        m.group("all", "*", dtype="f32")
        name = "blk.0.attn_q.weight"
        _, shape, raw = want[name]
        if src == "f16":
            ref = np.frombuffer(raw, "<f2").astype(np.float32)
        else:  # bf16 is the top half of an f32
            ref = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        with m.prepared(name) as ts:
            assert ts[0].dtype == np.float32 and ts[0].shape == shape
            assert np.array_equal(ts[0].reshape(-1), ref)


@pytest.mark.parametrize("dt", ["bf16", "q8_0", "q4_0"])
def test_dequantize_matches_the_definition(models, dt):
    path = models[("gguf", dt)]
    want, _ = reference(path)
    name = "blk.0.attn_q.weight"
    _, shape, raw = want[name]
    if dt == "bf16":
        ref = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    else:  # blocks of 32: an f16 scale d, then 32 int8 (q8_0) or 16 bytes of nibbles - 8 (q4_0)
        bb = 34 if dt == "q8_0" else 18
        blocks = np.frombuffer(raw, np.uint8).reshape(-1, bb)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        if dt == "q8_0":
            q = blocks[:, 2:].view(np.int8).astype(np.float32)
        else:
            lo = (blocks[:, 2:] & 0x0F).astype(np.float32) - 8
            hi = (blocks[:, 2:] >> 4).astype(np.float32) - 8
            q = np.concatenate([lo, hi], axis=1)
        ref = (q * d).reshape(-1)
    with ferry.Manager() as m:
        m.open(path)
        with m.prepared(name) as ts:
            got = ferry.dequantize(ts[0], dt)
    assert got.dtype == np.float32 and got.shape == shape
    assert np.array_equal(got.reshape(-1), ref)


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16", "q8_0", "q4_0"])
def test_matvec_against_numpy(models, dt):
    path = models[("gguf", dt)]
    want, _ = reference(path)
    name = "blk.0.ffn_down.weight"
    x = np.linspace(-1, 1, want[name][1][1], dtype=np.float32)
    with ferry.Manager() as m:
        m.open(path)
        with m.prepared([name]) as ts:
            ref = ferry.dequantize(ts[0], dt) if dt not in NUMPY else ts[0].astype(np.float32)
            y = ferry.matvec(ts[0], x)
    # the reference: numpy's product of the dequantized weight (checked above against the
    # definition of each type), in float64
    assert np.allclose(y, ref.astype(np.float64) @ x, rtol=1e-4, atol=1e-4)
