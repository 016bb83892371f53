"""zt.save / zt.load end to end: a job saves at world 2 stage 2, new jobs at other world sizes
and stages load that checkpoint by name and train on as the uninterrupted run did
(zt_checkpoint_worker.py)."""

import json
import subprocess

import pytest
import torch

from conftest import BUILD, HERE, env_for, scaled

WORKER = str(HERE / "zt_checkpoint_worker.py")
K, N = 3, 3  # steps before the save, steps after it


@pytest.fixture(scope="module")
def first_run(zerod_endpoint, tmp_path_factory):
    """The uninterrupted run: world 2, stage 2, saved after K steps, N more steps."""
    out = tmp_path_factory.mktemp("first")
    spec = {"phase": "first", "stage": 2, "k": K, "n": N, "ckpt": str(out / "ckpt")}
    cmd = [str(BUILD / "bin" / "zerorun"), "-n", "2", "--job", f"ckpt-first-{out.name}", "--",
           "/usr/bin/python3", WORKER, json.dumps(spec), str(out)]
    done = subprocess.run(cmd, env=env_for(zerod_endpoint), cwd=out, timeout=scaled(300),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert done.returncode == 0, done.stdout[-6000:]
    return out, [torch.load(out / f"first-rank{r}.pt") for r in range(2)]


def test_load_finds_nothing_where_nothing_was_saved(first_run):
    _, ranks = first_run
    assert all(r["nothing"] is None for r in ranks)


@pytest.mark.parametrize("world,stage", [(2, 2), (3, 2), (3, 3), (1, 0)])
def test_a_resumed_job_trains_on_as_the_uninterrupted_run(run_job, tmp_path, first_run, world,
                                                          stage):
    _, first = first_run
    # A new job starts from another job's checkpoint by naming it (a root load takes only the
    # job's own: docs/checkpoints.md).
    spec = {"phase": "resume", "stage": stage, "n": N, "ckpt": first[0]["directory"],
            "seed": 77}
    run_job(world, [WORKER, json.dumps(spec), str(tmp_path)])
    resumed = [torch.load(tmp_path / f"resume-rank{r}.pt") for r in range(world)]
    for res in resumed:
        step, user, directory = res["loaded"]
        assert (step, user, directory) == (K, {"epoch": 1, "batch": K}, first[0]["directory"])
        # Each rank's own buffers, rank 0's where the saving world had no such rank; the frozen
        # layer is rank 0's, as zt.shard makes it everyone's.
        source = first[res["rank"]] if res["rank"] < 2 else first[0]
        for name, value in source["saved_buffers"].items():
            assert torch.equal(res["loaded_buffers"][name], value), (res["rank"], name)
        assert torch.equal(res["frozen"], first[0]["frozen"])
        assert res["losses"] == pytest.approx(first[0]["losses"], rel=1e-5, abs=1e-6)
    if world == 2:
        # The same world: each rank's BatchNorm statistics go on exactly as they did.
        for res in resumed:
            for name, value in first[res["rank"]]["end_buffers"].items():
                torch.testing.assert_close(res["end_buffers"][name], value, rtol=1e-5, atol=1e-6)


def test_zeroctl_lists_the_saved_checkpoint_as_complete(zerod_endpoint, first_run):
    _, first = first_run
    done = subprocess.run([str(BUILD / "bin" / "zeroctl"), "checkpoints", first[0]["job"],
                           "--json"], env=env_for(zerod_endpoint), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=scaled(60))
    assert done.returncode == 0, done.stdout
    listed = json.loads(done.stdout)["checkpoints"]
    assert [(c["step"], c["state"], c["world_size"], c["stage"], c["directory"])
            for c in listed] == [(K, "complete", 2, 2, first[0]["directory"])], listed


def test_optimizer_state_dict_round_trips_and_refuses_another_shard(one_rank_job):
    import zerod.torch as zt
    from zerod.torch import ZerodError
    model, opt = zt.shard(torch.nn.Linear(3, 2), stage=1, dtype="bf16", lr=0.1)
    model(torch.ones(4, 3, dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
    saved = opt.state_dict()
    shard = saved["state"]["zerod"]
    assert (shard["rank"], shard["world_size"], shard["stage"]) == (0, 1, 1)
    assert shard["tensors"] == ["weight", "bias"]
    assert shard["counters"]["tensor_steps"] == [1, 1]
    assert shard["exp_avg_sq"].abs().sum() > 0 and "master" in shard  # bf16: the fp32 master too
    assert saved["param_groups"][0]["params"] == [0, 1]
    opt.param_groups[0]["lr"] = 0.5
    model(torch.ones(4, 3, dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["lr"] == 0.1
    again = opt.state_dict()["state"]["zerod"]
    for name in ("exp_avg", "exp_avg_sq", "master"):
        assert torch.equal(again[name], shard[name]), name
    assert again["counters"] == shard["counters"]
    other = dict(shard, rank=1, world_size=2)
    with pytest.raises(ZerodError, match="the shard is rank 1 of 2 at stage 1; this is rank 0 of "
                                         "1 at stage 1"):
        opt.load_state_dict({"state": {"zerod": other}, "param_groups": saved["param_groups"]})
    with pytest.raises(ZerodError, match="holds no zerod shard"):
        opt.load_state_dict({"state": {}, "param_groups": saved["param_groups"]})


def test_save_refuses_bad_arguments_naming_them(one_rank_job, tmp_path):
    import zerod.torch as zt
    from zerod.torch import ZerodError
    zt.shard(torch.nn.Linear(3, 2), stage=2)
    with pytest.raises(ZerodError, match="keep_last must be an integer >= 0"):
        zt.save(tmp_path, keep_last=-1)
    with pytest.raises(ZerodError, match="user is not JSON-serialisable"):
        zt.save(tmp_path, user={"x": object()})
    assert not any(tmp_path.iterdir())
    path = zt.save(tmp_path, user={"epoch": 0})
    assert zt.load(tmp_path) == (0, {"epoch": 0}, path)


def test_resume_skips_a_partial_and_a_damaged_newest_checkpoint_saying_so(one_rank_job, tmp_path,
                                                                         capfd):
    """zt.resume falls back to the newest intact checkpoint, and says on stderr which newer ones
    it skipped and why (zt.load does the same)."""
    import shutil
    from pathlib import Path
    import zerod.torch as zt
    model, opt = zt.shard(torch.nn.Linear(3, 2), stage=2)
    intact = zt.save(tmp_path, user={"epoch": 0})
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    damaged = Path(zt.save(tmp_path, user={"epoch": 1}))
    data = bytearray((damaged / "rank-00000.shard").read_bytes())
    data[4] ^= 0x10
    (damaged / "rank-00000.shard").write_bytes(bytes(data))
    partial = tmp_path / "step-000000000005"
    partial.mkdir()
    shutil.copy(Path(intact) / "rank-00000.shard", partial / "rank-00000.shard")
    capfd.readouterr()
    ckpt = zt.resume(tmp_path)
    err = capfd.readouterr().err
    assert ckpt == (0, {"epoch": 0}, intact)
    assert f"skipped newer: {partial} (rank files but no manifest.json)" in err, err
    assert f"{damaged} ({damaged}/rank-00000.shard: checksum mismatch" in err, err
    assert f"set aside as {damaged}.damaged-" in err, err


def test_resume_refuses_to_start_afresh_over_the_jobs_own_checkpoints(one_rank_job, tmp_path):
    """The job's records list a checkpoint under the root whose directory is gone: zt.resume
    fails naming it rather than return None and train from scratch; an empty directory elsewhere
    is a first run."""
    import shutil
    import zerod.torch as zt
    zt.shard(torch.nn.Linear(3, 2), stage=2)
    path = zt.save(tmp_path / "ckpt")
    shutil.rmtree(path)
    with pytest.raises(zt.ZerodError) as refused:
        zt.resume(tmp_path / "ckpt")
    assert "refusing to start from scratch" in str(refused.value), refused.value
    assert f"{path} (recorded complete, but its directory is missing)" in str(refused.value)
    assert zt.resume(tmp_path / "elsewhere") is None
