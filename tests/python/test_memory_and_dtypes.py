"""Memory as the plan says, parameters of released units holding no storage, and 16-bit training
against the fp32 reference."""

import pytest
import torch

import zt_reference
from test_equivalence import train


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_engine_allocates_the_plan(run_job, tmp_path, stage):
    spec = {"model": "nested", "stage": stage, "steps": 1}
    for res in train(run_job, tmp_path, spec, 2):
        stats = res["stats"]
        assert stats["allocated_bytes"] == stats["planned_bytes"]
        assert stats["memory"] == stats["planned_memory"]
        if stage == 3:
            assert stats["memory"]["gather_buffers"] > 0


def test_stage3_released_units_hold_no_storage(run_job, tmp_path):
    spec = {"model": "nested", "stage": 3, "steps": 2, "watch_storage": True}
    for res in train(run_job, tmp_path, spec, 2):
        # Between steps nothing is gathered: every parameter holds the placeholder of its shape,
        # one fp32 element that they all share.
        assert all(size == 4 for size in res["storage_after"].values()), res["storage_after"]
        # While the last layer runs, the first layer's parameters hold nothing and the last
        # layer's hold their values (2 steps: the forward ran twice).
        assert len(res["storage_during"]) == 2
        for seen in res["storage_during"]:
            assert seen["released"] and all(size == 4 for size in seen["released"])
            assert seen["gathered"] and all(size > 4 for size in seen["gathered"])


@pytest.mark.parametrize("stage", [0, 3])
def test_stages_below_3_keep_parameters_in_zerod_memory(run_job, tmp_path, stage):
    spec = {"model": "nested", "stage": stage, "steps": 1}
    for res in train(run_job, tmp_path, spec, 2):
        held = sum(res["storage_after"].values())
        if stage == 0:
            assert held == res["stats"]["memory"]["params"]  # views of the engine's buffer
        else:
            assert held == 4 * len(res["storage_after"])  # one shared element each


# 16-bit: parameters and gradients in bf16/fp16 (Adam's state fp32), against the fp32
# reference. Tolerance: each step's loss within 2% + 0.02 of the fp32 run's (bf16 keeps 8 bits
# of mantissa; the models' losses are about 1.6-2.0).
def _cpu_supports(dtype):
    try:
        torch.ones(2, 2, dtype=dtype) @ torch.ones(2, 2, dtype=dtype)
        return True
    except RuntimeError:
        return False


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("stage", [1, 3])
def test_16bit_loss_follows_fp32(run_job, tmp_path, dtype, stage):
    if dtype == "fp16" and not _cpu_supports(torch.float16):
        pytest.skip(f"torch {torch.__version__} has no fp16 matmul on the CPU (the GPU check "
                    "runs fp16)")
    spec = {"model": "nested", "stage": stage, "steps": 6, "dtype": dtype}
    reference = zt_reference.run(dict(spec, dtype="fp32"), 2)["losses"]
    for res in train(run_job, tmp_path, spec, 2):
        for got, want in zip(res["losses"], reference):
            assert abs(got - want) <= 0.02 + 0.02 * abs(want), (res["losses"], reference)
        # It trained: the loss moved as the fp32 run's did.
        assert (res["losses"][-1] - res["losses"][0]) * (reference[-1] - reference[0]) > 0


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_fp16_with_loss_scaling_follows_fp32(run_job, tmp_path, stage):
    # Element-wise ops only, so it runs on torch's CPU kernels; the worker calls
    # opt.backward(loss), which multiplies the loss by the scale; the engine unscales.
    spec = {"model": "elementwise", "stage": stage, "steps": 8, "dtype": "fp16",
            "shard": {"initial_scale_power": 8}}
    reference = zt_reference.run(dict(spec, dtype="fp32"), 2)["losses"]
    for res in train(run_job, tmp_path, spec, 2):
        for got, want in zip(res["losses"], reference):
            assert abs(got - want) <= 0.02 + 0.02 * abs(want), (res["losses"], reference)
        assert res["losses"][-1] < res["losses"][0]
        assert all(res["applied"]) and res["loss_scale"] == 2.0 ** 8  # no overflow: no change


def test_fp16_overflow_skips_steps_on_every_rank_and_backs_off(run_job, tmp_path):
    # 2^20 times these gradients overflows fp16 (largest 65504): steps are skipped, on both
    # ranks alike, and the scale halves (after the hysteresis of 2) until they fit.
    spec = {"model": "elementwise", "stage": 3, "steps": 12, "dtype": "fp16",
            "shard": {"initial_scale_power": 20}}
    results = train(run_job, tmp_path, spec, 2)
    assert results[0]["applied"] == results[1]["applied"]
    assert not results[0]["applied"][0] and results[0]["applied"][-1], results[0]["applied"]
    assert results[0]["loss_scale"] < 2.0 ** 20
