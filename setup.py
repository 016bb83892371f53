"""Builds zerod's native parts for the `zerod` package (pyproject.toml holds the metadata).

build_py builds the CMake targets zerod_c, zerod, zerorun and zeroctl in $ZEROD_BUILD_DIR (default
build/, the checkout's usual build folder, so an install after a build compiles nothing again): a
folder configured already is built as it was configured (its options stay), a new one is
configured and built by scripts/build.sh. Then libzerod_c.so goes into zerod/_lib/ and the
programs into zerod/_bin/ of the package being built, without their debug information (as torch's
wheels ship). $CMAKE_BUILD_PARALLEL_LEVEL caps the compile jobs. The library is loaded with ctypes
and serves every Python version: the wheel is tagged py3-none-<platform>. setuptools' own build
folder is python-package/ inside the CMake build folder, out of CMake's way.
"""

import os
import pathlib
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).resolve().parent
PROGRAMS = ("zerod", "zerorun", "zeroctl")
TARGETS = ("zerod_c", *PROGRAMS)


def cmake_build_dir():
    build = pathlib.Path(os.environ.get("ZEROD_BUILD_DIR", "build"))
    return build if build.is_absolute() else ROOT / build


class BuildWithNative(build_py):
    """build_py, then the native parts built and copied into the package."""

    def run(self):
        super().run()
        build = cmake_build_dir()
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL")
        # ccache keys on paths relative to the checkout, as scripts/build.sh sets it.
        env = {"CCACHE_BASEDIR": str(ROOT), "CCACHE_NOHASHDIR": "1",
               "CCACHE_COMPILERCHECK": "content", **os.environ, "ZEROD_BUILD_DIR": str(build)}
        if (build / "CMakeCache.txt").exists():
            command = ["cmake", "--build", str(build), *(["-j", jobs] if jobs else []),
                       "--target", *TARGETS]
        else:
            command = [str(ROOT / "scripts" / "build.sh"), *(["-j", jobs] if jobs else []),
                       *TARGETS]
        subprocess.run(command, cwd=ROOT, env=env, check=True)
        package = pathlib.Path(self.build_lib) / "zerod"
        pieces = [(build / "lib" / "libzerod_c.so", package / "_lib")]
        pieces += [(build / "bin" / name, package / "_bin") for name in PROGRAMS]
        strip = shutil.which("strip")
        for source, folder in pieces:
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / source.name)
            if strip:
                subprocess.run([strip, "--strip-debug", str(folder / source.name)], check=True)


commands = {"build_py": BuildWithNative}
try:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """A wheel for this platform (it holds native code) and any Python 3 (no extension
        module: the library is loaded with ctypes)."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    commands["bdist_wheel"] = PlatformWheel
except ImportError:  # no wheel package: pip builds the wheel elsewhere or installs directly
    pass


setup(cmdclass=commands,
      options={"build": {"build_base": str(cmake_build_dir() / "python-package")}})
