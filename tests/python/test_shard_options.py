"""zt.shard's options beyond the optimizer's, each observed in what the job does: joining with
explicit job=, rank=, world_size=, endpoint= (no ZEROD_* environment), the library from
$ZEROD_LIB, stage="auto" against a budget, bucket_cap_mb in the plan's memory, and units= by class
name."""

import json
import os
import subprocess
import textwrap

import pytest

import zerod.torch as zt
from zerod import ZerodError
import zt_models
from conftest import BUILD, HERE, ROOT, scaled

PLAN_WORKER = str(HERE / "zt_plan_worker.py")
LAYER_BYTES = 4160 * 4  # one Linear(64, 64) of zt_plan_worker's model, in fp32
MODEL_BYTES = 12 * LAYER_BYTES


def plans(run_job, tmp_path, world, shard_kwargs):
    run_job(world, [PLAN_WORKER, json.dumps({"runs": shard_kwargs}), str(tmp_path)])
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert all(r == results[0] for r in results[1:])  # every rank has the one plan
    return results[0]


def clean_env(**extra):
    """The environment without any ZEROD_* variable (and with `extra`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROD_")}
    env.update(PYTHONPATH=str(ROOT / "python"), OMP_NUM_THREADS="1", **extra)
    return env


JOIN_SCRIPT = textwrap.dedent("""
    import sys
    import torch, torch.nn as nn, torch.nn.functional as F
    import zerod.torch as zt
    rank, endpoint, job = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.manual_seed(rank)
    m = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6))
    m, opt = zt.shard(m, stage=2, job=job, rank=rank, world_size=2, endpoint=endpoint)
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(m(x[rank * 2:rank * 2 + 2]), y[rank * 2:rank * 2 + 2]).backward()
        opt.step()
    print("rank", zt.rank(), "of", zt.world_size(), "mean rank", zt.average(float(rank)))
    zt.shutdown()
""")


def test_joining_with_explicit_arguments_needs_no_environment(zerod_endpoint, tmp_path):
    # Two processes started by hand, not by zerorun: everything zt.shard needs is an argument.
    env = clean_env()
    if BUILD != ROOT / "build":  # the package finds build/ itself; a build elsewhere is named
        env["ZEROD_LIB"] = str(BUILD / "lib" / "libzerod_c.so")
    ranks = [subprocess.Popen(["/usr/bin/python3", "-c", JOIN_SCRIPT, str(r), zerod_endpoint,
                               f"explicit-{os.getpid()}"], env=env, cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(2)]
    outputs = [p.communicate(timeout=scaled(300))[0] for p in ranks]
    for r, (p, output) in enumerate(zip(ranks, outputs)):
        assert p.returncode == 0, output
        assert f"rank {r} of 2 mean rank 0.5" in output


def run_python(code, env):
    return subprocess.run(["/usr/bin/python3", "-c", code], env=env, text=True, timeout=scaled(120),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


LOAD = "import zerod._native as n; n.library(); print('loaded', n._lib._name)"


def test_zerod_lib_points_to_the_library(tmp_path):
    library = str(BUILD / "lib" / "libzerod_c.so")
    # A build folder that does not exist: the library can only come from ZEROD_LIB.
    done = run_python(LOAD, clean_env(ZEROD_LIB=library, ZEROD_BUILD_DIR=str(tmp_path / "none")))
    assert done.returncode == 0 and f"loaded {library}" in done.stdout, done.stdout


@pytest.mark.parametrize("exists, message", [
    (False, "ZEROD_LIB={path}: no such file"),
    (True, "ZEROD_LIB={path}: not zerod's C library"),
], ids=["missing", "not a library"])
def test_a_bad_zerod_lib_is_named(tmp_path, exists, message):
    path = tmp_path / "libzerod_c.so"
    if exists:
        path.write_text("not a library")
    done = run_python(LOAD, clean_env(ZEROD_LIB=str(path)))
    assert done.returncode != 0
    assert "ZerodError: " + message.format(path=path) in done.stdout, done.stdout


def test_bucket_cap_mb_sizes_the_plans_bucket_buffers(run_job, tmp_path):
    # Stage 2 holds two bucket buffers, each of the largest bucket: with DDP's 25 MiB the whole
    # model is one bucket; with 0.02 MiB (20,971 bytes) a bucket holds one layer (16,640 bytes),
    # with a neighbouring bias at most. The engine allocates what the plan says.
    big, small = plans(run_job, tmp_path, 2, [{"stage": 2, "bucket_cap_mb": 25},
                                              {"stage": 2, "bucket_cap_mb": 0.02}])
    assert big["planned_memory"]["bucket_buffers"] == 2 * MODEL_BYTES
    assert 2 * LAYER_BYTES <= small["planned_memory"]["bucket_buffers"] <= 2 * 0.02 * 2**20
    for plan in (big, small):
        assert plan["memory"] == plan["planned_memory"]
        assert plan["allocated_bytes"] == plan["planned_bytes"]
    assert big["planned_bytes"] - small["planned_bytes"] == \
        big["planned_memory"]["bucket_buffers"] - small["planned_memory"]["bucket_buffers"]


def test_stage_auto_picks_the_lowest_stage_within_the_budget(run_job, tmp_path):
    # At 2 ranks with small buckets, each stage needs less than the one before, but for stage 3's
    # gather buffers over stage 2's need on this model: stage 2 < 1 < 0, and 3 < 2.
    need = [p["planned_bytes"] for p in plans(
        run_job, tmp_path, 2, [{"stage": s, "bucket_cap_mb": 0.01} for s in range(4)])]
    assert need[3] < need[2] < need[1] < need[0]
    auto = [{"stage": "auto", "budget": b, "bucket_cap_mb": 0.01}
            for b in (need[0], need[1], need[3], need[3] - 1)]
    picked = plans(run_job, tmp_path, 2, auto)
    assert [p.get("stage") for p in picked[:3]] == [0, 1, 3]
    assert [p.get("planned_bytes") for p in picked[:3]] == [need[0], need[1], need[3]]
    refused = picked[3]
    assert refused["error"] == "RESOURCE_EXHAUSTED"
    assert "no ZeRO stage fits the budget of" in refused["message"]
    assert "per rank at 2 ranks; stage 3 needs" in refused["message"]


def test_units_by_class_name_are_the_units_by_class(one_rank_job):
    by_name, _ = zt.shard(zt_models.build("nested", 0), stage=3, units="Block")
    units = by_name._zerod_runtime.info["tensor_units"]
    zt.shutdown()
    by_class, _ = zt.shard(zt_models.build("nested", 0), stage=3, units={zt_models.Block})
    assert by_class._zerod_runtime.info["tensor_units"] == units
    # The root's unit (inp, out, gain) and one per Block.
    assert len(set(units)) == 3


def test_a_units_string_is_not_iterated(one_rank_job):
    # It used to be taken as the classes 'L', 'i', 'n', ...: a TypeError naming 'L'.
    with pytest.raises(ZerodError, match="units='Linearr': no module of the model is a Linearr"):
        zt.shard(zt_models.build("nested", 0), stage=3, units="Linearr")
