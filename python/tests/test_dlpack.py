"""DLPack: ferry's arrays export themselves (read-only ones included) on the cpu device; numpy and
torch share their memory."""
import gc

import numpy as np
import pytest

import ferry
from conftest import in_use_bytes, reference


def addr(a):
    return a.__array_interface__["data"][0]


def test_numpy_round_trip_shares_memory(models):
    path = models[("safetensors", "f32")]
    want, _ = reference(path)
    with ferry.Manager() as m:
        m.open(path)
        m.group("all", "*", load="mmap")
        with m.prepared(["blk.0.attn_q.weight", "token_embd.weight"]) as ts:
            a = ts[0]
            assert not a.flags.writeable          # the file mapping: numpy 1.24 would refuse
            assert a.__dlpack_device__() == (1, 0)
            b = np.from_dlpack(a)
            assert addr(b) == addr(a) and b.shape == a.shape and b.dtype == a.dtype
            assert b.tobytes() == want["blk.0.attn_q.weight"][2]
            v = ts[1][3:7, ::2]                   # a strided view of a view
            c = np.from_dlpack(v)
            assert addr(c) == addr(v) and c.strides == v.strides
            assert np.array_equal(c, v)
            with pytest.raises(BufferError):
                a.__dlpack__(stream=1)
            f = a.astype(np.float64)              # derived arrays forget ferry's dtype name
            assert type(f) is ferry.Array and f.ferry_dtype is None
            del a, b, c, v


def test_torch_shares_memory(models):
    torch = pytest.importorskip("torch", reason="torch (python3-torch) is not installed: the "
                                "DLPack round trip into torch is not tested")
    path = models[("gguf", "f16")]
    want, _ = reference(path)
    with ferry.Manager() as m:
        m.open(path)
        m.group("all", "*", home="disk", load="read")
        with m.prepared(["blk.0.attn_q.weight"]) as ts:
            t = torch.from_dlpack(ts[0])
            assert t.data_ptr() == addr(ts[0]) and t.dtype == torch.float16
            assert tuple(t.shape) == ts[0].shape
            assert t.numpy().tobytes() == want["blk.0.attn_q.weight"][2]
        # the torch tensor keeps the tensor prepared: still the file's bytes after the block
        assert t.numpy().tobytes() == want["blk.0.attn_q.weight"][2]
        assert in_use_bytes(m) > 0
        del t
        gc.collect()
        assert in_use_bytes(m) == 0


def test_unconsumed_capsule_frees(models):
    with ferry.Manager(schedule=False) as m:
        m.open(models[("gguf", "f32")])
        m.group("all", "*", home="disk", load="read")
        with m.prepared(["output_norm.weight"]) as ts:
            cap = ts[0].__dlpack__()
        assert in_use_bytes(m) > 0   # the capsule holds it
        del cap
        gc.collect()
        assert in_use_bytes(m) == 0
