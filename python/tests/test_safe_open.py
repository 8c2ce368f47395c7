"""ferry.safe_open behaves like safetensors' own safe_open: the same keys, metadata, shapes,
dtypes, values and slices as the file read from its specification (conftest.py)."""
import json
import os
import struct
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
def unets(workdir):
    out = []
    for fmt, dt in (("safetensors", "f16"), ("gguf", "q8_0")):
        path = os.path.join(workdir, "unet_%s.%s" % (dt, fmt))
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


def write_safetensors(path, tensors):
    """A safetensors file from {name: (DTYPE, shape, bytes)}, written from the specification."""
    header, off = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for _, _, raw in tensors.values():
            f.write(raw)


def test_sharded_index(models, workdir):
    want, _ = reference(models[("safetensors", "bf16")])
    names = sorted(want)
    shards = [names[: len(names) // 2], names[len(names) // 2:]]
    folder = os.path.join(workdir, "sharded")
    os.makedirs(folder, exist_ok=True)
    weight_map = {}
    for i, part in enumerate(shards):
        fname = "model-%05d-of-00002.safetensors" % (i + 1)
        write_safetensors(os.path.join(folder, fname),
                          {n: (want[n][0].upper(), want[n][1], want[n][2]) for n in part})
        weight_map.update({n: fname for n in part})
    index = os.path.join(folder, "model.safetensors.index.json")
    with open(index, "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with ferry.safe_open(index) as f:
        assert f.keys() == names
        for n in names:
            assert f.get_tensor(n).tobytes() == want[n][2]
            assert f.get_slice(n)[1:2].tobytes() == as_numpy(*want[n])[1:2].tobytes()
