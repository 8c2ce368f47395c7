"""Errors raise FerryError subclasses named after ferry's codes, with ferry's message; the manager
stays usable after one. How the library is found, and that another major version is refused."""
import os
import shutil
import subprocess
import sys

import pytest

import ferry

PKG = os.path.dirname(os.path.dirname(os.path.abspath(ferry.__file__)))


def test_codes_and_messages(models, workdir):
    assert issubclass(ferry.ENOENT, ferry.FerryError) and ferry.ENOENT.code == -4
    assert ferry.EFORMAT.__name__ == "EFORMAT" and ferry.EBUDGET.code == -18
    m = ferry.Manager(host_budget="64KiB")
    with pytest.raises(ferry.ENOENT) as e:
        m.open(os.path.join(workdir, "missing.gguf"))
    assert "missing.gguf" in str(e.value) and e.value.strerror
    bad = os.path.join(workdir, "truncated.safetensors")
    with open(models[("safetensors", "f16")], "rb") as f:
        blob = f.read()
    with open(bad, "wb") as f:
        f.write(blob[:100])
    with pytest.raises(ferry.FerryError) as e:
        m.open(bad)
    assert type(e.value) in (ferry.ETRUNC, ferry.EFORMAT, ferry.EJSON)
    assert "truncated.safetensors" in e.value.message
    path = models[("gguf", "f16")]
    m.open(path)                           # still usable
    m.group("all", "*", home="disk", load="read")
    m.expect("blk.0.attn_q.weight", "q8_0", [64, 32])
    m.expect("blk.0.attn_k.weight", None, [1, 2, 3])
    with pytest.raises(ferry.EDTYPE) as e:
        m.validate()
    lines = str(e.value).splitlines()
    assert any("blk.0.attn_q.weight" in ln and "q8_0" in ln and "f16" in ln for ln in lines)
    assert any("blk.0.attn_k.weight" in ln and "[1, 2, 3]" in ln for ln in lines)
    with pytest.raises(ferry.EDTYPE, match="expected dtype q8_0"):   # prepare checks them too
        m.prepared(["blk.0.attn_q.weight"]).__enter__()
    m.close()
    m = ferry.Manager(host_budget="64KiB")
    m.open(path)
    m.group("all", "*", home="disk", load="read")
    with pytest.raises(ferry.EBUDGET) as e:           # 64 KiB cannot hold every tensor at once
        with m.prepared(m.keys()):
            pass
    assert "budget" in str(e.value)
    with pytest.raises(ferry.ENOENT, match="no tensor 'nope'"):
        m.prepared(["nope"]).__enter__()
    with pytest.raises(ferry.ENOENT):
        m.set_budget("sim:1GiB", 1 << 20)
    with pytest.raises(ValueError, match="home"):
        m.group("g", "x*", home="attic")
    with pytest.raises(ValueError, match="not a size"):
        m.set_budget(0, "lots")
    with pytest.raises(ferry.FerryError):
        m.add_device("nonsense:1")
    with m.prepared(["blk.0.attn_q.weight"]) as ts:   # and it still prepares
        assert ts[0].nbytes == 64 * 64 * 2
    m.close()


def run_import(env, pkgdir=PKG):
    env = dict(env, PYTHONPATH=pkgdir, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-c", "import ferry; print(ferry.library_path)"],
                          env=env, capture_output=True, text=True)


def clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("FERRY_LIBRARY", "LD_LIBRARY_PATH")}


def test_library_search_order(workdir):
    lib = os.path.realpath(ferry.library_path)
    # 1. $FERRY_LIBRARY
    r = run_import(dict(clean_env(), FERRY_LIBRARY=lib))
    assert r.returncode == 0 and r.stdout.strip() == lib, r.stderr
    r = run_import(dict(clean_env(), FERRY_LIBRARY="/nonexistent/libferry.so.0"))
    assert r.returncode != 0 and "FERRY_LIBRARY=/nonexistent/libferry.so.0: no such file" in r.stderr
    # 2. beside the package (before the system path)
    copy = os.path.join(workdir, "beside")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(os.path.join(PKG, "ferry"), os.path.join(copy, "ferry"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.so*"))
    os.symlink(lib, os.path.join(copy, "ferry", "libferry.so.0"))
    r = run_import(dict(clean_env(), LD_LIBRARY_PATH=os.path.dirname(lib)), copy)
    assert r.returncode == 0 and r.stdout.strip() == os.path.join(copy, "ferry", "libferry.so.0")
    # 3. the system path
    os.unlink(os.path.join(copy, "ferry", "libferry.so.0"))
    r = run_import(dict(clean_env(), LD_LIBRARY_PATH=os.path.dirname(lib)), copy)
    assert r.returncode == 0 and r.stdout.strip() == "libferry.so.0", r.stderr
    r = run_import(dict(clean_env(), LD_LIBRARY_PATH="/nonexistent"), copy)
    if r.returncode != 0:   # (unless one is installed system-wide)
        assert "libferry.so.0 not found" in r.stderr and "FERRY_LIBRARY" in r.stderr


def test_other_major_version_refused(workdir):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler to build a library of another major version")
    src = os.path.join(workdir, "v1.c")
    so = os.path.join(workdir, "libferry-v1.so")
    with open(src, "w") as f:
        f.write('unsigned ferry_version_number(void) { return 10203; }\n'
                'const char *ferry_version(void) { return "1.2.3"; }\n')
    subprocess.run([cc, "-shared", "-fPIC", "-o", so, src], check=True)
    r = run_import(dict(clean_env(), FERRY_LIBRARY=so))
    assert r.returncode != 0
    assert "libferry 1.2.3 (major version 1); this package needs major version 0" in r.stderr


def test_one_class_per_code_of_the_header():
    header = os.path.join(PKG, "..", "include", "ferry.h")
    if not os.path.isfile(header):
        pytest.skip("not in a source tree: no include/ferry.h beside python/")
    import re
    with open(header) as f:
        codes = dict((m.group(1), int(m.group(2)))
                     for m in re.finditer(r"FERRY_(E[A-Z]+) = (-\d+)", f.read()))
    assert codes and all(getattr(ferry, n).code == c for n, c in codes.items()), codes
    assert len(ferry._errors.BY_CODE) == len(codes)


def test_changed_file(models, workdir):
    path = os.path.join(workdir, "changing.safetensors")
    shutil.copyfile(models[("safetensors", "f16")], path)
    with ferry.safe_open(path) as f:
        f.get_tensor("output_norm.weight")
        f._m.check_files()
        with open(path, "r+b") as g:       # same size, other bytes, another modification time
            g.seek(-64, 2)
            g.write(b"\xff" * 64)
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        with pytest.raises(ferry.ECHANGED, match="changing.safetensors"):
            f.get_tensor("output.weight")
        with pytest.raises(ferry.ECHANGED):
            f._m.check_files()
