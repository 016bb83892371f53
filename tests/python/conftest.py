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


@pytest.fixture(scope="session")
def zerod_endpoint():
    work = tempfile.mkdtemp(prefix="zt-test-")
    sock = os.path.join(work, "zerod.sock")
    log = open(os.path.join(work, "zerod.log"), "w")
    daemon = subprocess.Popen([str(BUILD / "bin" / "zerod"), "--socket", sock, "--listen", "",
                               "--data-dir", os.path.join(work, "data"), "--log-level", "warn"],
                              stdout=log, stderr=subprocess.STDOUT)
    for _ in range(400):
        if os.path.exists(sock):
            break
        time.sleep(0.025)
    else:
        daemon.kill()
        raise RuntimeError(f"zerod did not start; see {work}/zerod.log")
    yield f"unix://{sock}"
    daemon.terminate()
    daemon.wait(timeout=30)


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
    """run_job(n, [script, args...]) -> (returncode, output), ranks launched by zerorun."""

    def run(ranks, argv, expect_ok=True, timeout=300, zerorun_flags=()):
        _jobs[0] += 1
        job = f"pytest-{os.getpid()}-{_jobs[0]}"
        cmd = [str(BUILD / "bin" / "zerorun"), "-n", str(ranks), "--job", job, *zerorun_flags,
               "--", "/usr/bin/python3", *argv]
        done = subprocess.run(cmd, env=env_for(zerod_endpoint), cwd=tmp_path, timeout=timeout,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
