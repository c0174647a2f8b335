"""Builds the zshard package from the source tree: CMake builds the
_zshard binding and zshard-server (so `zshard launch` has servers to
start) from the repository two levels up, for the interpreter running
pip. Needs the C++ build's Debian packages (deploy/install-deps.sh).

    pip install ./client/python

Environment: ZSHARD_BUILD_TYPE (Release), ZSHARD_PIP_BUILD_DIR (a build
directory to reuse; default build-pip/ at the repository root).
"""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        build = os.environ.get("ZSHARD_PIP_BUILD_DIR",
                               os.path.join(ROOT, "build-pip"))
        kind = os.environ.get("ZSHARD_BUILD_TYPE", "Release")
        env = dict(os.environ, CCACHE_BASEDIR=ROOT, CCACHE_NOHASHDIR="true")
        subprocess.check_call(
            ["cmake", "-S", ROOT, "-B", build, "-G", "Ninja",
             f"-DCMAKE_BUILD_TYPE={kind}", "-DZSHARD_WITH_PYTHON=ON",
             f"-DPython_EXECUTABLE={sys.executable}"], env=env)
        subprocess.check_call(["cmake", "--build", build, "--target",
                               "_zshard", "zshard-server"], env=env)
        built = os.path.join(build, "python", "zshard")
        module = next(f for f in os.listdir(built) if f.startswith("_zshard")
                      and f.endswith(".so"))
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(built, module), target)
        bindir = os.path.join(os.path.dirname(target), "bin")
        os.makedirs(bindir, exist_ok=True)
        shutil.copy2(os.path.join(build, "server", "zshard-server"),
                     os.path.join(bindir, "zshard-server"))


setup(ext_modules=[Extension("zshard._zshard", sources=[])],
      cmdclass={"build_ext": CMakeBuild})
