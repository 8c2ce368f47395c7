"""The ctypes structs have the size and member offsets of include/ferry.h's structs, as the C
compiler lays them out (layout.c, built with the library)."""
import ctypes
import json
import os
import subprocess

import pytest

from ferry import _lib


def test_structs_match_the_header():
    exe = os.environ.get("FERRY_LAYOUT")
    if not exe:
        pytest.skip("FERRY_LAYOUT (the layout program built with the library) is not set")
    c = json.loads(subprocess.run([exe], check=True, capture_output=True, text=True).stdout)
    assert set(c) == set(_lib.STRUCTS)
    for name, cls in _lib.STRUCTS.items():
        want = dict(c[name])
        assert ctypes.sizeof(cls) == want.pop("size"), name
        fields = [f[0] for f in cls._fields_]
        assert fields == list(want), (name, fields, list(want))
        for member, off in want.items():
            assert getattr(cls, member).offset == off, (name, member)
