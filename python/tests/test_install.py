"""`make install` (cmake --install) puts the package where the interpreter finds it, beside a link
to the installed library; `pip install --no-build-isolation ./python` works with Debian's
setuptools alone and bundles the built library."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

import ferry

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # python/


def clean_env(**kw):
    env = {k: v for k, v in os.environ.items()
           if k not in ("FERRY_LIBRARY", "LD_LIBRARY_PATH", "PYTHONPATH")}
    env.update(kw, PYTHONDONTWRITEBYTECODE="1")
    return env


PROBE = ("import ferry, numpy; m = ferry.Manager(); print(ferry.library_path); "
         "print(ferry.library_version); m.close()")


def test_cmake_install(workdir):
    build = os.environ.get("FERRY_BUILD_DIR")
    if not build:
        pytest.skip("FERRY_BUILD_DIR is not set")
    prefix = os.path.join(workdir, "prefix")
    shutil.rmtree(prefix, ignore_errors=True)
    cmake = os.environ.get("FERRY_CMAKE", "cmake")
    subprocess.run([cmake, "--install", build, "--prefix", prefix], check=True,
                   capture_output=True)
    sites = [os.path.join(r, d) for r, ds, _ in os.walk(prefix) for d in ds if d == "ferry"
             and os.path.isfile(os.path.join(r, d, "__init__.py"))]
    assert len(sites) == 1, sites
    site = os.path.dirname(sites[0])
    v = sys.version_info
    assert site.endswith("python%d.%d/dist-packages" % v[:2]) or \
        site.endswith("python%d.%d/site-packages" % v[:2]), site
    link = os.path.join(sites[0], "libferry.so.0")
    assert os.path.islink(link) and not os.path.isabs(os.readlink(link))
    r = subprocess.run([sys.executable, "-c", PROBE], env=clean_env(PYTHONPATH=site),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [link, ferry.library_version]
    assert os.path.realpath(link).startswith(os.path.realpath(prefix))


def test_pip_install(workdir):
    if not all(importlib.util.find_spec(m) for m in ("pip", "setuptools")):
        pytest.skip("pip or setuptools is missing (python3-pip, python3-setuptools)")
    work = os.path.join(workdir, "pip")
    shutil.rmtree(work, ignore_errors=True)
    src = os.path.join(work, "src")
    shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info",
                                                           "tests", "*.so*"))
    target = os.path.join(work, "target")
    env = clean_env(FERRY_LIBRARY=os.path.realpath(ferry.library_path))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                        "--no-deps", "--no-index", "--target", target, src],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c", PROBE], env=clean_env(PYTHONPATH=target),
                       capture_output=True, text=True, cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == os.path.join(target, "ferry", "libferry.so.0")
