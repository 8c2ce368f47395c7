#!/usr/bin/env python3
"""python_bench.py — what the Python layer costs, measured in one run on one model:

 1. ferry.safe_open(MODEL).get_tensor over every tensor, against the same reads with Python's own
    mmap + numpy.frombuffer (each tensor copied into a new array, as get_tensor returns one);
 2. ferry.Manager streaming the model under a host budget (home disk; each layer prepared, y = W.x
    on every 2-D weight with ferry.matvec, released), against `ferry run` with the same options;
    and the Python layer's own time per pass, measured alone (the same loop over a warm
    zero-copy model with one-row products: no reads, no copies, no compute).

Each cold and warm, alternating the two sides (each side a fresh process, timed inside it),
RUNS times; medians. Cold: the page cache dropped
(echo 3 > /proc/sys/vm/drop_caches, root) before each get_tensor sweep, and the file's pages
dropped before each streamed pass (`ferry run --cold` does the same, posix_fadvise DONTNEED).
The disk's O_DIRECT read speed is measured in the same run (dd iflag=direct).

  usage: python_bench.py MODEL.safetensors [--ferry build/ferry] [--runs 3] [--passes 3]
                         [--budget-frac 0.25] [--json]
"""
import argparse
import datetime
import json
import mmap
import os
import re
import statistics
import struct
import subprocess
import sys
import time

import numpy as np

import ferry

ST = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
      "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def fadvise_dontneed(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def dd_direct(path):
    drop_caches()
    t0 = time.perf_counter()
    r = subprocess.run(["dd", "if=" + path, "of=/dev/null", "bs=16M", "iflag=direct"],
                       capture_output=True, text=True)
    dt = time.perf_counter() - t0
    m = re.search(r"^(\d+) bytes", r.stderr, re.M)
    return int(m.group(1)) / dt / 1e9 if m else float("nan")


def sweep_ferry(path):
    t0 = time.perf_counter()
    n = 0
    with ferry.safe_open(path) as f:
        for name in f.keys():
            n += f.get_tensor(name).nbytes
    return time.perf_counter() - t0, n


def sweep_mmap(path):
    t0 = time.perf_counter()
    n = 0
    with open(path, "rb") as fh:
        (hlen,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(hlen))
        header.pop("__metadata__", None)
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        base = 8 + hlen
        for name in sorted(header):
            d = header[name]
            a, b = d["data_offsets"]
            dt = np.dtype(ST[d["dtype"]])
            arr = np.frombuffer(mm, dtype=dt, count=(b - a) // dt.itemsize, offset=base + a)
            n += np.array(arr.reshape(d["shape"]), copy=True).nbytes
            del arr
        mm.close()
    return time.perf_counter() - t0, n


def layers(names):
    """Consecutive names sharing the part up to the first all-digit component (as `ferry run`)."""
    def key(n):
        parts = n.split(".")
        for i, p in enumerate(parts):
            if p.isdigit():
                return ".".join(parts[:i + 1])
        return ".".join(parts[:-1])
    out = []
    for n in names:
        if out and key(out[-1][-1]) == key(n):
            out[-1].append(n)
        else:
            out.append([n])
    return out


def stream_python(path, budget, passes, cold):
    times = []
    with ferry.Manager(host_budget=budget) as m:
        m.open(path)
        m.group("all", "*", home="disk", load="auto", lazy=False)
        sets = layers(m.keys())
        infos = {n: m.info(n) for n in m.keys()}
        cols = max(i["row_elems"] for i in infos.values())
        x = ((np.arange(cols, dtype=np.uint64) * 2654435761 % 1000) / 1000.0 - 0.5) \
            .astype(np.float32)
        for _ in range(passes):
            if cold:
                fadvise_dontneed(path)
            t0 = time.perf_counter()
            for s in sets:
                with m.prepared(s) as ts:
                    for name, w in ts.items():
                        if len(infos[name]["shape"]) >= 2:
                            ferry.matvec(w.reshape(infos[name]["n_rows"], -1),
                                         x[:infos[name]["row_elems"]])
                    del w
            times.append(time.perf_counter() - t0)
    return times


def layer_cost(path, passes):
    """The Python layer's own time per pass, an upper bound: the same loop as stream_python
    over a warm zero-copy model (no reads, no copies), each product cut to one row (the wrapper's
    whole cost, no compute)."""
    warm(path)
    times = []
    with ferry.Manager() as m:
        m.open(path)
        m.group("all", "*", home="host", load="mmap", lazy=False)
        sets = layers(m.keys())
        infos = {n: m.info(n) for n in m.keys()}
        cols = max(i["row_elems"] for i in infos.values())
        x = np.zeros(cols, dtype=np.float32)
        with m.prepared(m.keys()):     # resident before timing
            pass
        for _ in range(passes + 1):
            t0 = time.perf_counter()
            for s in sets:
                with m.prepared(s) as ts:
                    for name, w in ts.items():
                        if len(infos[name]["shape"]) >= 2:
                            ferry.matvec(w.reshape(infos[name]["n_rows"], -1)[:1],
                                         x[:infos[name]["row_elems"]])
                    del w
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def stream_cli(cli, path, budget, passes, cold):
    cmd = [cli, "run", path, "--home", "disk", "--load", "auto", "--lazy", "off",
           "--budget", "host=%d" % budget, "--passes", str(passes), "--json", "--quiet"]
    if cold:
        cmd.append("--cold")
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [p["seconds"] for p in json.loads(r.stdout)["passes"]]


def child(kind, *args):
    """Runs one measured side in a fresh interpreter (as a user's process would be, and as
    `ferry run` is): its time, measured inside it, excluding start-up and imports."""
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind] +
                       [str(x) for x in args], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit("python_bench: %s failed:\n%s" % (kind, r.stderr))
    return json.loads(r.stdout)


def run_child(argv):
    kind = argv[0]
    if kind == "sweep-ferry":
        out = sweep_ferry(argv[1])[0]
    elif kind == "sweep-mmap":
        out = sweep_mmap(argv[1])[0]
    elif kind == "layer-cost":
        out = layer_cost(argv[1], int(argv[2]))
    else:
        out = stream_python(argv[1], int(argv[2]), int(argv[3]), argv[4] == "1")
    print(json.dumps(out))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return run_child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--ferry", default="build/ferry")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--budget-frac", type=float, default=0.25)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    size = os.path.getsize(a.model)
    budget = int(size * a.budget_frac)
    res = {"date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), "model": a.model,
           "model_bytes": size, "budget_bytes": budget, "library": ferry.library_path,
           "dd_direct_gbps": [], "get_tensor": {}, "stream": {}}
    for mode in ("cold", "warm"):
        res["get_tensor"][mode] = {"ferry": [], "mmap": []}
        res["stream"][mode] = {"python": [], "cli": []}
    for run in range(a.runs):
        res["dd_direct_gbps"].append(dd_direct(a.model))
        for mode in ("cold", "warm"):
            order = [("ferry", "sweep-ferry"), ("mmap", "sweep-mmap")]
            if run % 2:
                order.reverse()
            for side, fn in order:
                if mode == "cold":
                    drop_caches()
                else:
                    warm(a.model)
                res["get_tensor"][mode][side].append(child(fn, a.model))
            order = [("python", "stream"), ("cli", None)]
            if run % 2:
                order.reverse()
            for side, fn in order:
                if mode == "warm":
                    warm(a.model)
                ts = child(fn, a.model, budget, a.passes, int(mode == "cold")) if fn else \
                    stream_cli(a.ferry, a.model, budget, a.passes, mode == "cold")
                # a pass after the first: the schedule is recorded, the kept set in place
                res["stream"][mode][side].append(statistics.median(ts[1:]) if len(ts) > 1
                                                 else ts[0])
        res.setdefault("layer_cost_s", []).append(child("layer-cost", a.model, a.passes))
        print("run %d done" % (run + 1), file=sys.stderr)
    med = statistics.median
    res["summary"] = {
        "dd_direct_gbps": med(res["dd_direct_gbps"]),
        "layer_cost_s_per_pass": med(res["layer_cost_s"]),
        "get_tensor": {m: {"ferry_s": med(v["ferry"]), "mmap_s": med(v["mmap"]),
                           "ferry_gbps": size / med(v["ferry"]) / 1e9,
                           "mmap_gbps": size / med(v["mmap"]) / 1e9,
                           "ratio_ferry_over_mmap_time": med(v["ferry"]) / med(v["mmap"]),
                           "paired_ratios": [x / y for x, y in zip(v["ferry"], v["mmap"])]}
                       for m, v in res["get_tensor"].items()},
        "stream": {m: {"python_s_per_pass": med(v["python"]), "cli_s_per_pass": med(v["cli"]),
                       "python_cost": med(v["python"]) / med(v["cli"]) - 1,
                       "paired_ratios": [x / y for x, y in zip(v["python"], v["cli"])],
                       "layer_cost_over_cli": med(res["layer_cost_s"]) / med(v["cli"])}
                   for m, v in res["stream"].items()},
    }
    if a.json:
        print(json.dumps(res, indent=1))
        return
    report(res, a, size, budget)


def report(res, a, size, budget):
    s = res["summary"]
    print("%s  model %s (%.2f GiB), host budget %.2f GiB, %d runs" %
          (res["date"], a.model, size / 2**30, budget / 2**30, a.runs))
    print("disk, O_DIRECT read (dd, 16 MiB): %s GB/s" %
          " / ".join("%.2f" % g for g in res["dd_direct_gbps"]))
    for m, v in s["get_tensor"].items():
        print("get_tensor, %s: ferry %.2f s (%.2f GB/s) [%s]; mmap+frombuffer %.2f s (%.2f GB/s) "
              "[%s]; time ratio %.3f (paired: %s)" % (
                  m, v["ferry_s"], v["ferry_gbps"],
                  ", ".join("%.2f" % t for t in res["get_tensor"][m]["ferry"]),
                  v["mmap_s"], v["mmap_gbps"],
                  ", ".join("%.2f" % t for t in res["get_tensor"][m]["mmap"]),
                  v["ratio_ferry_over_mmap_time"],
                  ", ".join("%.2f" % r for r in v["paired_ratios"])))
    print("the Python layer's own time per pass (no I/O, no compute): %.4f s [%s]" % (
        s["layer_cost_s_per_pass"], ", ".join("%.4f" % t for t in res["layer_cost_s"])))
    for m, v in s["stream"].items():
        print("stream, %s: Manager %.3f s/pass [%s]; ferry run %.3f s/pass [%s]; Python cost "
              "%+.1f%% (paired ratios: %s); layer's own time / ferry run's pass %.2f%%" % (
                  m, v["python_s_per_pass"],
                  ", ".join("%.3f" % t for t in res["stream"][m]["python"]),
                  v["cli_s_per_pass"], ", ".join("%.3f" % t for t in res["stream"][m]["cli"]),
                  100 * v["python_cost"], ", ".join("%.2f" % r for r in v["paired_ratios"]),
                  100 * v["layer_cost_over_cli"]))


if __name__ == "__main__":
    main()
