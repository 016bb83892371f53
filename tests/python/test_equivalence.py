"""Every stage and world size against the unsharded reference (zt_reference.py)."""

import json

import pytest
import torch

import zt_reference
from conftest import HERE

WORKER = str(HERE / "zt_worker.py")


def train(run_job, tmp_path, spec, world):
    run_job(world, [WORKER, json.dumps(spec), str(tmp_path)])
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def assert_matches(results, reference, rtol=1e-4, atol=1e-5):
    for res in results:
        expected_state = reference["states"][res["rank"]]
        assert res["state"].keys() == expected_state.keys()
        for name, expected in expected_state.items():
            torch.testing.assert_close(res["state"][name].float(), expected.float(), rtol=rtol,
                                       atol=atol, msg=lambda m: f"rank {res['rank']} {name}: {m}")
        assert res["losses"] == pytest.approx(reference["losses"], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_fp32_equals_unsharded_adamw(run_job, tmp_path, stage, world):
    spec = {"model": "nested", "stage": stage, "steps": 4, "weight_decay": 0.1}
    assert_matches(train(run_job, tmp_path, spec, world), zt_reference.run(spec, world))
