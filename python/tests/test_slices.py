"""Slices through the Python package: "NAME[FIRST:END]" names rows of a tensor's outermost
dimension, prepared as a unit of its own; its array is those rows of the whole tensor's."""
import numpy as np
import pytest

import ferry
from conftest import models  # noqa: F401  (the fixture)


@pytest.mark.parametrize("fmt", ["gguf", "safetensors"])
def test_slice_rows_are_the_tensors(models, fmt):  # noqa: F811
    path = models[(fmt, "f16")]
    with ferry.Manager() as m:
        m.open(path)
        m.group("all", "*", home="disk", load="read", experts=True)
        whole = np.array(m.prepare("token_embd.weight"))
        with m.prepared(["token_embd.weight[3:7]", "token_embd.weight[0:1]"]) as ts:
            assert ts[0].shape == (4,) + whole.shape[1:]
            assert np.array_equal(np.asarray(ts[0]), whole[3:7])
            assert np.array_equal(np.asarray(ts[1]), whole[0:1])
        assert m.info("token_embd.weight[3:7]")["name"] == "token_embd.weight[3:7]"
        names = [p["name"] for p in m.plan()]
        assert "token_embd.weight[255:256]" in names and "token_embd.weight" not in names
        with pytest.raises(ferry.EINVAL, match="outside"):
            m.prepare("token_embd.weight[250:300]")
        with pytest.raises(ferry.EINVAL):
            m.prepare("token_embd.weight[5:5]")
        with pytest.raises(ferry.ENOENT):
            m.prepare("no_such.weight[0:1]")


@pytest.mark.parametrize("fmt", ["gguf"])
def test_prefetch_guess(models, fmt):  # noqa: F811
    path = models[(fmt, "f16")]
    with ferry.Manager() as m:
        m.open(path)
        m.group("all", "*", home="disk", load="read", experts=True)
        whole = np.array(m.prepare("token_embd.weight"))
        m.prefetch_guess(["token_embd.weight[2:3]", "token_embd.weight[9:10]"])
        with m.prepared(["token_embd.weight[2:3]"]) as ts:
            assert np.array_equal(np.asarray(ts[0]), whole[2:3])
        st = m.stats()
        assert st["guess_bytes"] >= st["guess_unused_bytes"] >= 0
