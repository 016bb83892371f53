"""The console scripts `zerod`, `zerorun` and `zeroctl` that pip installs: each runs the program
of that name built with the package (zerod/_bin/), or the checkout's build when run from one."""

import os
import sys

from zerod._native import program_path


def _run(name):
    path = program_path(name)
    if path is None:
        sys.stderr.write(f"{name}: the {name} program was not installed with the zerod package "
                         "nor built in its checkout (scripts/build.sh)\n")
        sys.exit(2)
    os.execv(path, [name, *sys.argv[1:]])


def zerod():
    _run("zerod")


def zerorun():
    _run("zerorun")


def zeroctl():
    _run("zeroctl")
