"""Arrays after release, the manager's lifetime, and Python threads preparing and releasing."""
import concurrent.futures
import gc
import os
import random
import subprocess

import numpy as np
import pytest

import ferry
from conftest import CLI, in_use_bytes, reference


def test_sequence_raises_after_the_block_and_kept_arrays_stay_valid(models):
    path = models[("gguf", "f16")]
    want, _ = reference(path)
    m = ferry.Manager(host_budget="16MiB")
    m.open(path)
    m.group("all", "*", home="disk", load="read")
    name = "blk.1.ffn_down.weight"
    with m.prepared([name, "output_norm.weight"]) as ts:
        kept = ts[0][2:5]          # a view of a view
    with pytest.raises(ferry.FerryError, match="released at the end"):
        ts[0]
    with pytest.raises(ferry.FerryError):
        len(ts)
    # the kept view holds its tensor: prepared still, so its bytes are still the file's
    assert in_use_bytes(m) >= len(want[name][2])
    with pytest.raises(ferry.EBUSY):
        m.remove_group("all")
    assert kept.tobytes() == np.frombuffer(want[name][2], np.float16).reshape(
        want[name][1])[2:5].tobytes()
    m.close()                      # the memory stays until the last array dies
    with pytest.raises(ferry.FerryError, match="closed"):
        m.keys()
    assert kept.tobytes() == np.frombuffer(want[name][2], np.float16).reshape(
        want[name][1])[2:5].tobytes()
    del kept
    gc.collect()


def test_release_at_block_end_frees_disk_copies(models):
    path = models[("safetensors", "f32")]
    # no schedule: no prefetch in flight
    with ferry.Manager(schedule=False) as m:
        m.open(path)
        m.group("all", "*", home="disk", load="read")
        with m.prepared(m.keys()):
            assert in_use_bytes(m) > 0
        assert in_use_bytes(m) == 0
        a = m.prepare("token_embd.weight")
        assert in_use_bytes(m) >= 256 * 64 * 4
        with pytest.raises(ferry.EBUSY):
            m.remove_group("all")
        del a
        assert in_use_bytes(m) == 0
        m.remove_group("all")    # nothing is prepared any more


def test_thread_pool_prepares_and_releases(workdir):
    path = os.path.join(workdir, "threads.gguf")
    subprocess.run([CLI, "gen", "-q", "-o", path, "--layers", "4", "--dim", "128", "--ff", "256",
                    "--vocab", "256"], check=True)   # blk.* 1.3 MiB, 64 KiB a tensor at most
    want, _ = reference(path)
    # a budget smaller than the model (evictions), larger than 4 threads x 2 tensors in use
    with ferry.Manager(host_budget="768KiB") as m:
        m.open(path)
        m.group("blk", "blk.*", home="disk", load="read")
        names = [n for n in m.keys() if n.startswith("blk.")]

        def work(seed):
            rng = random.Random(seed)
            for _ in range(60):
                pick = rng.sample(names, 2)
                with m.prepared(pick) as ts:
                    # (a comprehension: no loop variable keeps an array alive past the block)
                    bad = [n for n, a in ts.items() if a.tobytes() != want[n][2]]
                if bad:
                    return "bytes of %s differ" % bad
            return None

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(work, range(16)))
        assert results == [None] * 16
        st = m.stats()
        assert st["prepares"] >= 16 * 60 * 2 and st["evictions"] > 0
    gc.collect()
