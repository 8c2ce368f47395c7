"""ferry.safe_open behaves like safetensors' own safe_open: the same keys, metadata, shapes,
dtypes, values and slices as the file read from its specification (conftest.py)."""
import os
import subprocess

import numpy as np
import pytest

import ferry
from conftest import CLI, MODELS, reference

ST_NAMES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}
NUMPY = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


def as_numpy(dtype, shape, raw):
    if dtype in NUMPY:
        return np.frombuffer(raw, NUMPY[dtype]).reshape(shape)
    return np.frombuffer(raw, np.uint8).reshape(shape[:-1] + (-1,))


@pytest.mark.parametrize("fmt,dt", MODELS)
@pytest.mark.parametrize("budget", [None, "1MiB"])
def test_like_safetensors(models, fmt, dt, budget):
    path = models[(fmt, dt)]
    want, meta = reference(path)
    with ferry.safe_open(path, framework="np", budget=budget) as f:
        assert f.keys() == sorted(want)
        if fmt == "safetensors":
            assert f.metadata() == meta
        else:
            md = f.metadata()
            for k, v in meta.items():
                assert md[k] == pytest.approx(v) if isinstance(v, float) else md[k] == v, k
        for passes in range(2):
            for name in f.keys():
                dtype, shape, raw = want[name]
                a = f.get_tensor(name)
                assert type(a) is np.ndarray and a.flags.writeable and a.flags.owndata
                assert a.tobytes() == raw, name
                ref = as_numpy(dtype, shape, raw)
                assert a.shape == ref.shape and a.dtype == ref.dtype
                s = f.get_slice(name)
                assert s.get_shape() == list(shape)
                if fmt == "safetensors":
                    assert s.get_dtype() == ST_NAMES[dt if dtype != "f32" else "f32"]
                n = shape[0]
                for sl in [slice(1, 3), slice(0, n), slice(n - 1, None), slice(-2, None),
                           slice(2, 2), slice(0, n, 2)]:
                    assert np.array_equal(s[sl], ref[sl]), (name, sl)
                assert np.array_equal(s[n - 1], ref[n - 1])
                if len(shape) == 2:
                    assert np.array_equal(s[1:4, 2:5], ref[1:4, 2:5])
                    assert np.array_equal(s[:, 3], ref[:, 3])


def test_missing_tensor(models):
    with ferry.safe_open(models[("safetensors", "f16")]) as f:
        with pytest.raises(ferry.ENOENT, match="no tensor 'nope'"):
            f.get_tensor("nope")
        with pytest.raises(ferry.ENOENT):
            f.get_slice("nope")
        with pytest.raises(IndexError):
            f.get_slice("token_embd.weight")[256]


def test_torch(models):
    torch = pytest.importorskip("torch", reason="torch (python3-torch) is not installed: "
                                "framework='pt' not tested")
    for dt in ("f32", "f16", "bf16"):
        path = models[("safetensors", dt)]
        want, _ = reference(path)
        with ferry.safe_open(path, framework="pt") as f:
            for name in f.keys():
                dtype, shape, raw = want[name]
                t = f.get_tensor(name)
                assert isinstance(t, torch.Tensor) and tuple(t.shape) == shape
                assert t.dtype == {"f32": torch.float32, "f16": torch.float16,
                                   "bf16": torch.bfloat16}[dtype]
                assert t.view(torch.uint8).numpy().tobytes() == raw
                assert torch.equal(f.get_slice(name)[1:3], t[1:3])


@pytest.fixture(scope="module")
def unets(tmpdir_session):
    out = []
    for fmt, dt in (("safetensors", "f16"), ("gguf", "q8_0")):
        path = os.path.join(tmpdir_session, "unet_%s.%s" % (dt, fmt))
        subprocess.run([CLI, "gen", "-q", "-o", path, "--arch", "unet", "--dim", "32",
                        "--layers", "1", "--dtype", dt], check=True)
        out.append(path)
    return out


def test_conv_kernels_and_mixed_types(unets):
    """4-D conv kernels (slices along the outermost axis of a 4-D tensor) and GGUF files that
    mix quantized, f16 and f32 tensors."""
    for path in unets:
        want, _ = reference(path)
        with ferry.safe_open(path) as f:
            assert f.keys() == sorted(want)
            n4 = 0
            for name in f.keys():
                dtype, shape, raw = want[name]
                a = f.get_tensor(name)
                assert a.tobytes() == raw, name
                ref = as_numpy(dtype, shape, raw)
                if len(shape) == 4:
                    n4 += 1
                    s = f.get_slice(name)
                    assert np.array_equal(s[1:3], ref[1:3]), name
                    assert np.array_equal(s[-1, :, 0], ref[-1, :, 0]), name
            assert n4 > 10
