"""Installing and launching as torch users do: pip install into a clean venv, then one training
script started with torchrun's environment (2 ranks, set as torchrun sets it: Debian's torchrun
fails under Python 3.11 with torch 1.13), by torchrun itself where it works (torch 2.x), as a
single process with no environment at all, and by zerorun. Each run trains as single-process
torch on the global batch does (zt_reference), torch's DistributedSampler shards the data through
the default process group zt.shard made, and dist.all_reduce sums a metric over it."""

import json
import os
import socket
import subprocess

import pytest
import torch

import zt_reference
from conftest import BUILD, HERE, ROOT, scaled
from test_equivalence import FP32, assert_matches

WORKER = str(HERE / "zt_launch_worker.py")
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


def user_env(**extra):
    """A user's shell: no zerod or launcher variables, no checkout on the Python path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ZEROD_") and k not in TORCHRUN_VARIABLES and k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A new venv that sees Debian's packages (torch) with zerod pip-installed from the checkout.
    pip builds in the tests' build folder, configured and built already: it compiles nothing,
    packs the library and programs, and installs them; nothing is downloaded (--no-index)."""
    where = tmp_path_factory.mktemp("venv")
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(where)],
                   check=True, timeout=scaled(120))
    done = subprocess.run(
        [str(where / "bin" / "pip"), "install", "--no-build-isolation", "--no-index",
         "--no-cache-dir", "."],
        env=user_env(ZEROD_BUILD_DIR=str(BUILD), CMAKE_BUILD_PARALLEL_LEVEL="2"), cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=scaled(900))
    assert done.returncode == 0, done.stdout[-6000:]
    return where


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(python, world, argv, out, hosts=1):
    """`world` ranks with torchrun's variables as torchrun sets them, spread over `hosts` hosts
    (LOCAL_WORLD_SIZE = world / hosts; each host its own home: XDG_CONFIG_HOME, where zerod would
    keep a job token it made); each rank's output in out/log<R>."""
    port = free_port()
    per_host = world // hosts
    ranks = []
    for r in range(world):
        env = user_env(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r % per_host),
                       LOCAL_WORLD_SIZE=str(per_host), GROUP_RANK=str(r // per_host),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       TORCHELASTIC_RESTART_COUNT="0",
                       XDG_CONFIG_HOME=str(out / f"host{r // per_host}"))
        with open(out / f"log{r}", "w") as log:
            ranks.append(subprocess.Popen([str(python), *argv], env=env, cwd=out, stdout=log,
                                          stderr=subprocess.STDOUT))
    return ranks


def wait_ranks(ranks, out, timeout=300):
    try:
        for p in ranks:
            p.wait(timeout=scaled(timeout))
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [(out / f"log{r}").read_text() for r in range(len(ranks))]
    return [p.returncode for p in ranks], logs


def train_ranks(python, world, spec, out, hosts=1):
    codes, logs = wait_ranks(start_ranks(python, world, [WORKER, json.dumps(spec), str(out)],
                                         out, hosts), out)
    for r, (code, log) in enumerate(zip(codes, logs)):
        assert code == 0, f"rank {r} exited {code}:\n{log[-4000:]}"
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


def check_run(results, spec, world, venv=None):
    """Trained as torch on the global batch; the sampler gave each rank its share; zerod came
    from the venv when given; the embedded zerod, if any, is gone with its folder."""
    assert_matches(results, zt_reference.run(spec, world), **FP32)
    batch = spec.get("batch", 6)
    for res in results:
        assert (res["world"], res["group_world"], res["backend"]) == (world, world, "gloo")
        assert res["rows"] == [list(range(batch))[res["rank"]::world]] * spec["steps"]
        if venv is not None:
            assert res["package"].startswith(str(venv)), res["package"]
            assert res["library"].startswith(str(venv)), res["library"]
        if res["zerod"] is not None:
            assert not os.path.exists(res["zerod"]["folder"])
            assert not os.path.exists(f"/proc/{res['zerod']['pid']}")


def test_pip_installs_the_package_with_its_library_and_programs(venv, tmp_path):
    probe = ("import json, zerod, zerod.torch, zerod._native as n; print(json.dumps("
             "[zerod.__file__, n._library_path(), n.program_path('zerod')]))")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", probe], env=user_env(),
                          cwd=tmp_path, stdout=subprocess.PIPE, text=True, check=True,
                          timeout=scaled(120))
    for path in json.loads(done.stdout):
        assert path.startswith(str(venv / "lib")), path
    for program in ("zerod", "zerorun", "zeroctl"):
        shown = subprocess.run([str(venv / "bin" / program), "--help"], env=user_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=scaled(60))
        assert shown.returncode == 0 and program in shown.stdout, shown.stdout


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_torchrun_environment_trains_as_torch_on_the_global_batch(venv, tmp_path, stage):
    spec = {"model": "nested", "stage": stage, "steps": 3, "weight_decay": 0.1}
    results = train_ranks(venv / "bin" / "python", 2, spec, tmp_path)
    check_run(results, spec, 2, venv)
    # Every rank on one host: rank 0's embedded zerod listened on a Unix socket.
    assert results[0]["zerod"]["endpoint"].startswith("unix://")
    assert results[1]["zerod"] is None


def test_ranks_on_two_hosts_reach_the_embedded_zerod_over_tcp(venv, tmp_path):
    spec = {"model": "nested", "stage": 3, "steps": 3}
    results = train_ranks(venv / "bin" / "python", 2, spec, tmp_path, hosts=2)
    check_run(results, spec, 2, venv)
    assert results[0]["zerod"]["endpoint"].startswith("127.0.0.1:")
    # The job's token came from rank 0 through the rendezvous: no host made or kept one of its
    # own (two would differ, and the second join would be refused).
    for host in ("host0", "host1"):
        assert not (tmp_path / host / "zerod").exists()


@pytest.mark.parametrize("stage", [0, 3])
def test_a_single_process_without_any_environment_trains_as_torch(venv, tmp_path, stage):
    spec = {"model": "nested", "stage": stage, "steps": 3, "weight_decay": 0.1}
    subprocess.run([str(venv / "bin" / "python"), WORKER, json.dumps(spec), str(tmp_path)],
                   env=user_env(), cwd=tmp_path, check=True, timeout=scaled(300))
    results = [torch.load(tmp_path / "rank0.pt")]
    check_run(results, spec, 1, venv)
    assert results[0]["zerod"]["endpoint"].startswith("unix://")


def test_torchrun_itself(venv, tmp_path):
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip(f"torch {torch.__version__}'s torchrun fails under this Python (its "
                    "elastic agent); the torchrun environment is tested above")
    spec = {"model": "nested", "stage": 3, "steps": 3}
    subprocess.run([str(venv / "bin" / "python"), "-m", "torch.distributed.run",
                    "--nproc_per_node", "2", "--master_port", str(free_port()), WORKER,
                    json.dumps(spec), str(tmp_path)],
                   env=user_env(), cwd=tmp_path, check=True, timeout=scaled(300))
    check_run([torch.load(tmp_path / f"rank{r}.pt") for r in range(2)], spec, 2, venv)


def test_zerorun_ranks_get_a_process_group_too(run_job, tmp_path):
    spec = {"model": "nested", "stage": 2, "steps": 3}
    run_job(2, [WORKER, json.dumps(spec), str(tmp_path)])
    check_run([torch.load(tmp_path / f"rank{r}.pt") for r in range(2)], spec, 2)


SHARD = "import torch, zerod.torch as zt; zt.shard(torch.nn.Linear(2, 2))"


@pytest.mark.parametrize("env, message", [
    ({"RANK": "1"}, "RANK is set but not WORLD_SIZE"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but not RANK"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR is not set"),
    ({"ZEROD_RANK": "0", "ZEROD_WORLD_SIZE": "1"}, "ZEROD_JOB is not set"),
])
def test_a_partial_launch_environment_is_named(tmp_path, env, message):
    done = subprocess.run(["/usr/bin/python3", "-c", SHARD],
                          env=user_env(PYTHONPATH=str(ROOT / "python"),
                                       ZEROD_BUILD_DIR=str(BUILD), **env),
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=scaled(120))
    assert done.returncode != 0
    assert message in done.stdout, done.stdout[-3000:]
