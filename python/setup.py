"""Installs the ferry package (pure Python). When a built libferry.so.0 is at $FERRY_LIBRARY or
in ../build, a copy goes into the package, where `import ferry` looks second (after
$FERRY_LIBRARY, before the system path)."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def built_library():
    for p in (os.environ.get("FERRY_LIBRARY"), os.path.join(HERE, "..", "build", "libferry.so.0")):
        if p and os.path.isfile(p):
            return os.path.realpath(p)
    return None


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = built_library()
        if lib and not os.environ.get("FERRY_NO_BUNDLE"):
            shutil.copyfile(lib, os.path.join(self.build_lib, "ferry", "libferry.so.0"))


setup(cmdclass={"build_py": BuildPy})
