"""The manager's other calls: plans, statistics, budgets, devices, traces, writable policies,
and a docstring on every public name."""
import inspect
import json
import os

import pytest

import ferry
from conftest import reference


def test_plan_stats_budget_devices_trace(models, workdir):
    path = models[("gguf", "f16")]
    want, _ = reference(path)
    with ferry.Manager(devices=["sim:16MiB"], io_threads=2) as m:
        m.open(path, prefix="base.")
        assert all(k.startswith("base.") for k in m.keys())
        m.group("blk", "base.blk.*", home="disk", load="read")
        m.group("out", "base.output*", home="host", load="read", compute_device="sim:16MiB")
        m.ignore("base.token_embd.*")
        plan = m.plan()
        by = {p["name"]: p for p in plan}
        assert "base.token_embd.weight" not in by
        assert by["base.blk.0.attn_q.weight"]["home"] == "disk"
        assert by["base.output.weight"]["compute_device"] == 1
        assert by["base.output.weight"]["compute_bytes"] == len(want["output.weight"][2])
        tot = m.plan_totals()
        assert len(tot["device_bytes"]) == 2 and tot["disk_bytes"] == sum(
            len(want[k][2]) for k in want if k.startswith("blk."))
        devs = m.devices()
        assert [d["kind"] for d in devs] == ["cpu", "sim"] and devs[1]["host_accessible"] is False
        m.set_budget("sim:16MiB", "8MiB")
        assert m.devices()[1]["budget"] == 8 << 20
        trace = os.path.join(workdir, "trace.json")
        with m.trace(trace):
            with m.prepared([k for k in m.keys() if "blk.0." in k]) as ts:
                assert len(ts) == 9
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
        assert any("blk.0.attn_q.weight" in json.dumps(e) for e in events)
        st = m.stats()
        assert st["prepares"] == 9 and st["bytes_read"] >= sum(
            len(want[k][2]) for k in want if k.startswith("blk.0."))
        assert len(st["resident_bytes"]) == 2 and isinstance(st["wait_seconds"], float)


def test_budgets_and_reservations(models):
    with pytest.raises(ferry.EBUDGET, match="budget"):
        ferry.Manager(host_budget=1 << 62)          # above what the host can ever hold
    with ferry.Manager(host_budget="64MiB") as m:
        m.open(models[("gguf", "f16")])
        m.group("all", "*", home="disk", load="read")
        m.reserve("cpu", "1MiB")
        assert m.devices()[0]["used_bytes"] >= 1 << 20
        with pytest.raises(ferry.EBUDGET):
            m.reserve(0, "1GiB")                     # above the budget itself
        m.reserve(0, 0)
        assert m.devices()[0]["used_bytes"] < 1 << 20


def test_writable_policy(models):
    path = models[("safetensors", "f32")]
    with ferry.Manager() as m:
        m.open(path)
        if not ferry._lib.HAS_WRITABLE:
            with pytest.raises(ferry.EUNSUPPORTED, match="ferry_tensor_writable"):
                m.group("w", "*", writable=True)
            m.group("w", "*", home="host", load="read")
            with m.prepared(["blk.0.attn_q.weight"]) as ts:
                assert not ts[0].flags.writeable   # without the call nothing is writable
            return
        m.group("w", "*", writable=True)
        with m.prepared(["blk.0.attn_q.weight"]) as ts:
            a = ts[0]
            assert a.flags.writeable
            a[0, 0] = 42.0
            assert a[0, 0] == 42.0
            del a


def public_names():
    for name in ferry.__all__:
        obj = getattr(ferry, name)
        if isinstance(obj, (str, type(None))):
            continue
        yield name, obj
        if inspect.isclass(obj) and not issubclass(obj, ferry.FerryError):
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and (callable(member) or isinstance(member, property)):
                    yield "%s.%s" % (name, attr), member


def test_every_public_name_has_a_docstring():
    missing = [n for n, o in public_names() if not (inspect.getdoc(o) or "").strip()]
    assert not missing, missing
    assert ferry.__doc__ and ferry.FerryError.__doc__
