"""The torch examples (examples/torch/gpt.py and resnet.py) run end to end under zerorun, and
gpt.py at stage 3 on 2 ranks (with and without activation checkpointing) ends at the loss its
unsharded --reference run ends at."""

import json
import os
import re
import subprocess

import pytest

from conftest import ROOT, scaled

EXAMPLES = ROOT / "examples" / "torch"
GPT = str(EXAMPLES / "gpt.py")
RESNET = str(EXAMPLES / "resnet.py")
# Small enough for a few seconds on two CPU cores; fp32 so the reference can match closely.
GPT_SMALL = ["--steps", "8", "--batch", "8", "--context", "32", "--width", "64", "--layers", "2",
             "--heads", "4", "--lr", "3e-3", "--seed", "1"]
RANK_PREFIX = re.compile(r"^\[rank (\d+)\] ?")


def lines_of(output, rank=0):
    """Rank `rank`'s lines (zerorun prefixes each with "[rank R] "); unprefixed lines count as
    rank 0's (a plain single-process run)."""
    result = []
    for line in output.splitlines():
        m = RANK_PREFIX.match(line)
        if m is None:
            if rank == 0 and not line.startswith("zerorun:"):
                result.append(line)
        elif int(m.group(1)) == rank:
            result.append(line[m.end():])
    return result


def parse(output):
    """(per-step losses, the final JSON object) of rank 0's output."""
    lines = lines_of(output)
    steps = [re.fullmatch(r"step (\d+) loss (\S+) time (\S+) ms", line) for line in lines]
    losses = [float(m.group(2)) for m in steps if m]
    assert [int(m.group(1)) for m in steps if m] == list(range(len(losses))), output[-3000:]
    assert lines and lines[-1].startswith("{"), f"no final JSON line:\n{output[-3000:]}"
    return losses, json.loads(lines[-1])


def run_reference(argv):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"), str(EXAMPLES),
                                         env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("ZEROD_ENDPOINT", None)
    done = subprocess.run(["/usr/bin/python3", *argv, "--reference"], env=env, timeout=scaled(300),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert done.returncode == 0, done.stdout[-6000:]
    return done.stdout


def test_gpt_stage3_learns_and_matches_reference(run_job):
    # --sample: greedy generation afterwards, collective forwards under no_grad at stage 3.
    _, output = run_job(2, [GPT, "--stage", "3", "--sample", "16", *GPT_SMALL])
    losses, result = parse(output)
    assert len(losses) == 8
    assert losses[-1] < losses[0], losses
    assert result["stage"] == 3 and result["world_size"] == 2 and result["dtype"] == "fp32"
    assert result["final_loss"] == pytest.approx(losses[-1], rel=1e-5)
    assert result["params"] > 0 and result["step_time_ms"] > 0
    assert 0 < result["model_state_bytes_per_rank"] <= result["allocated_bytes_per_rank"]
    assert result["bytes_sent_per_step"] > 0
    # Rank 1 prints nothing but what torch/zerod may log: no step lines, no JSON.
    assert not any(line.startswith(("step ", "{")) for line in lines_of(output, rank=1))

    ref_losses, ref = parse(run_reference([GPT, *GPT_SMALL]))
    assert ref["reference"] is True and ref["world_size"] == 1
    assert result["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-4)
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    assert result["params"] == ref["params"]


@pytest.mark.parametrize("checkpointing", ["non-reentrant", "reentrant"])
def test_gpt_stage3_with_activation_checkpointing_matches_reference(run_job, checkpointing):
    # zt.shard's default options: one gather unit per block, max_live_units within its budget.
    flag = ["--checkpoint-activations", checkpointing]
    _, output = run_job(2, [GPT, "--stage", "3", *flag, *GPT_SMALL])
    losses, result = parse(output)
    assert result["checkpoint_activations"] == checkpointing
    assert result["gather_overflows"] == 0
    ref_losses, ref = parse(run_reference([GPT, *flag, *GPT_SMALL]))
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert result["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-5)


def test_gpt_elastic_restart_resumes_from_the_in_memory_snapshot_as_if_uninterrupted(run_job,
                                                                                   tmp_path):
    """zerorun --max-restarts: rank 1 is killed after step 4; the world starts again, zt.resume
    takes the snapshot of step 4 from shared memory (newer than the checkpoint of step 2 on disk),
    and the run ends where the uninterrupted one ends."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm: zerorun gives its ranks no snapshot directory here")
    args = [GPT, "--stage", "2", *GPT_SMALL, "--checkpoint-every", "2"]
    _, whole = run_job(2, [*args, "--checkpoint-dir", str(tmp_path / "whole")])
    _, output = run_job(2, [*args, "--checkpoint-dir", str(tmp_path / "elastic"), "--kill-rank-at",
                            "1:4"], zerorun_flags=["--max-restarts", "1"])
    assert "[rank 1] rank 1: failure injection: SIGKILL after step 4" in output
    assert "zerorun: restart 1 of 1: 2 ranks" in output
    assert re.search(r"\[rank 0\] rank 0: resumed from step 4 \(/dev/shm/\S+/step-000000000004\)",
                     output), output[-3000:]
    final = json.loads(lines_of(output)[-1])
    assert final["first_step"] == 4
    assert final["final_loss"] == pytest.approx(json.loads(lines_of(whole)[-1])["final_loss"],
                                                rel=1e-6)


def test_gpt_batch_must_divide_by_world_size(run_job):
    code, output = run_job(2, [GPT, "--batch", "7", "--steps", "1"], expect_ok=False)
    assert code != 0
    assert "--batch 7 does not divide by the world size 2" in output


def test_resnet_stage2(run_job):
    _, output = run_job(2, [RESNET, "--stage", "2", "--steps", "3", "--batch", "8"])
    losses, result = parse(output)
    assert len(losses) == 3
    assert result["stage"] == 2 and result["world_size"] == 2 and result["dtype"] == "fp32"
    assert result["final_loss"] == pytest.approx(losses[-1], rel=1e-5)
    assert result["params"] == 11_181_642  # resnet18 with 10 classes
    assert 0 < result["model_state_bytes_per_rank"] <= result["allocated_bytes_per_rank"]
    assert result["bytes_sent_per_step"] > 0 and result["step_time_ms"] > 0
