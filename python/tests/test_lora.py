"""LoRA through Python: the merged weight is W + m * (alpha / rank) * B.A computed here with numpy
from the files' bytes, and changing the multiplier re-merges."""
import os
import subprocess

import numpy as np
import pytest

import ferry
from conftest import CLI, read_safetensors


@pytest.fixture(scope="module")
def base_and_lora(models, workdir):
    base = models[("safetensors", "f32")]
    lora = os.path.join(workdir, "lora.safetensors")
    subprocess.run([CLI, "gen", "-q", "--lora", base, "-o", lora, "--rank", "4", "--seed", "3"],
                   check=True)
    return base, lora


def expected(base, lora, name, peft, mult):
    bt, _ = read_safetensors(base)
    lt, meta = read_safetensors(lora)
    _, shape, raw = bt[name]
    w = np.frombuffer(raw, "<f4").reshape(shape).astype(np.float64)
    a = lt["base_model.model.model.%s.lora_A.weight" % peft]
    b = lt["base_model.model.model.%s.lora_B.weight" % peft]
    am = np.frombuffer(a[2], "<f2").reshape(a[1]).astype(np.float64)
    bm = np.frombuffer(b[2], "<f2").reshape(b[1]).astype(np.float64)
    rank = am.shape[0]
    return w + mult * float(meta["lora_alpha"]) / rank * (bm @ am)


def test_multiplier_change_remerges(base_and_lora):
    base, lora = base_and_lora
    name, peft = "blk.0.attn_q.weight", "layers.0.self_attn.q_proj"
    with ferry.Manager() as m:
        m.open(base)
        m.group("all", "*", home="host", load="mmap")
        ad = m.add_lora(lora, 0.5)
        info = ad.info
        assert info["scheme"] == "peft" and info["n_matched"] == info["n_pairs"] == 14
        assert info["multiplier"] == 0.5 and ad.multiplier == 0.5
        epoch = m.lora_epoch
        for mult in (0.5, 2.0, -1.0):
            if mult != 0.5:
                ad.multiplier = mult
                assert m.lora_epoch > epoch
                epoch = m.lora_epoch
            with m.prepared(name) as ts:
                got = np.array(ts[0], dtype=np.float64)
            want = expected(base, lora, name, peft, mult)
            assert np.allclose(got, want, rtol=1e-5, atol=1e-6), mult
        ad.remove()
        with m.prepared(name) as ts:
            assert ts[0].tobytes() == read_safetensors(base)[0][name][2]
        with pytest.raises(ferry.ENOENT):
            ad.multiplier = 1.0


def test_bad_adapter_message(base_and_lora, models):
    _, lora = base_and_lora
    with ferry.Manager() as m:
        m.open(models[("gguf", "f16")], prefix="x.")   # other names: the adapter matches nothing
        ad = m.add_lora(lora, 1.0)
        assert ad.info["n_matched"] == 0 and ad.info["n_unmatched"] == 14
        assert ad.info["unmatched"]
        with pytest.raises(ferry.FerryError) as e:
            m.add_lora(models[("gguf", "f16")], 1.0)   # a model, not an adapter
        assert e.value.message and e.value.code < 0
