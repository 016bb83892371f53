"""Fixtures of the front-end tests: a real zerod (its own socket and data dir) and a launcher
that runs a job of real rank processes through zerorun with Debian's /usr/bin/python3."""

import os
import pathlib
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("ZEROD_BUILD_DIR", ROOT / "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(HERE))


def time_scale():
    """How much slower than an idle optimized build real time passes for this run:
    $ZEROD_TEST_TIME_SCALE (a number from 1 to 100, as tests/util/test_time.h reads it), else 1.
    These tests run in the optimized build only."""
    try:
        value = float(os.environ.get("ZEROD_TEST_TIME_SCALE", ""))
    except ValueError:
        return 1.0
    return value if 1 <= value <= 100 else 1.0


def scaled(seconds):
    """A real-time bound in seconds (a timeout, a lease, a wait) scaled for this run."""
    return seconds * time_scale()


@pytest.fixture(scope="session")
def zerod_endpoint():
    work = tempfile.mkdtemp(prefix="zt-test-")
    sock = os.path.join(work, "zerod.sock")
    log = open(os.path.join(work, "zerod.log"), "w")
    # zerod's default lease (10 s), scaled: the ranks of a loaded run keep theirs.
    daemon = subprocess.Popen([str(BUILD / "bin" / "zerod"), "--socket", sock, "--listen", "",
                               "--data-dir", os.path.join(work, "data"), "--log-level", "warn",
                               "--lease-ttl", f"{int(scaled(10) * 1000)}ms"],
                              stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + scaled(10)
    while not os.path.exists(sock):
        if time.monotonic() > deadline:
            daemon.kill()
            raise RuntimeError(f"zerod did not start; see {work}/zerod.log")
        time.sleep(0.025)
    yield f"unix://{sock}"
    daemon.terminate()
    daemon.wait(timeout=scaled(30))


_jobs = [0]


def env_for(endpoint):
    env = dict(os.environ)
    env["ZEROD_ENDPOINT"] = endpoint
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")])
    env["ZEROD_BUILD_DIR"] = str(BUILD)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.fixture
def run_job(zerod_endpoint, tmp_path):
    """run_job(n, [script, args...]) -> (returncode, output), ranks launched by zerorun; `timeout`
    in seconds on an idle optimized build (scaled)."""

    def run(ranks, argv, expect_ok=True, timeout=300, zerorun_flags=()):
        _jobs[0] += 1
        job = f"pytest-{os.getpid()}-{_jobs[0]}"
        cmd = [str(BUILD / "bin" / "zerorun"), "-n", str(ranks), "--job", job, *zerorun_flags,
               "--", "/usr/bin/python3", *argv]
        done = subprocess.run(cmd, env=env_for(zerod_endpoint), cwd=tmp_path,
                              timeout=scaled(timeout), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if expect_ok and done.returncode != 0:
            raise AssertionError(f"job failed ({done.returncode}):\n{done.stdout[-6000:]}")
        return done.returncode, done.stdout

    return run


_one_rank_jobs = [0]


@pytest.fixture
def one_rank_job(zerod_endpoint, monkeypatch):
    """The test process itself is rank 0 of a job of one (zt.shard in-process); shut down after."""
    import zerod.torch as zt
    _one_rank_jobs[0] += 1
    monkeypatch.setenv("ZEROD_ENDPOINT", zerod_endpoint)
    monkeypatch.setenv("ZEROD_JOB", f"one-{os.getpid()}-{_one_rank_jobs[0]}")
    monkeypatch.setenv("ZEROD_RANK", "0")
    monkeypatch.setenv("ZEROD_WORLD_SIZE", "1")
    yield
    zt.shutdown()
