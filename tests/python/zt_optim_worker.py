"""One rank of an optimizer test job: zt_gpt's model and loop under zt.shard with a torch AdamW
(two parameter groups) and OneCycleLR, optionally saved and resumed.

    zerorun -n N -- /usr/bin/python3 zt_optim_worker.py '{"stage": 3, "total_steps": 8, ...}' OUT

phase "train" (default): steps [0, total_steps). phase "first": steps [0, k), then a checkpoint
("save": "zt" with zt.save(scheduler=), "torch": per-rank torch.save of opt.state_dict(),
sched.state_dict() and zt.full_state_dict), then [k, total_steps). phase "resume": loads it
("save" as above) into a fresh model, optimizer and scheduler, then [k, total_steps).
Writes OUT/<phase>-rank<R>.pt: losses, lrs, betas[0], the full state dict, tensor step counts.
"""

import json
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zt_gpt  # noqa: E402
import zerod.torch as zt  # noqa: E402


def shard(spec, rank):
    # Every rank but 0 starts from other values: zt.shard gives them rank 0's.
    model = zt_gpt.build(spec.get("seed", 0) + (0 if rank == 0 else 100 + rank))
    source = zt_gpt.make_optimizer(model, spec)
    sched = None
    if spec.get("scheduler_on") == "source":  # built on the torch optimizer before zt.shard
        sched = zt_gpt.make_scheduler(source, spec)
    kwargs = {"optimizer": source, "stage": spec["stage"],
              "gradient_accumulation_steps": spec.get("accumulation", 1)}
    if "accumulation_reduction" in spec:
        kwargs["accumulation_reduction"] = spec["accumulation_reduction"]
    if "lr_override" in spec:  # a rank-dependent hyperparameter, for the join check
        source.param_groups[0]["lr"] = spec["lr_override"][rank]
    if "stages" in spec:  # a rank-dependent stage, for the join check
        kwargs["stage"] = spec["stages"][rank]
    model, opt = zt.shard(model, **kwargs)
    if sched is None:
        sched = zt_gpt.make_scheduler(opt, spec)
    return model, opt, sched


def tensor_steps(opt):
    shard_state = opt.state_dict()["state"]["zerod"]
    return dict(zip(shard_state["tensors"], shard_state["counters"]["tensor_steps"]))


def main():
    spec = json.loads(sys.argv[1])
    out = sys.argv[2]
    phase = spec.get("phase", "train")
    rank, world = zt.rank(), zt.world_size()
    local_size = spec.get("batch", 6) // world

    def local(t):
        return t[rank * local_size:(rank + 1) * local_size]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, opt, sched = shard(spec, rank)
        first, last = 0, spec["total_steps"]
        result = {"rank": rank, "world": world, "losses": [], "lrs": [], "beta1s": []}
        ckpt = os.path.join(spec.get("ckpt", out), "ckpt")
        if phase == "resume":
            first = spec["k"]
            if spec["save"] == "zt":
                # Another job's checkpoint loads when named (a root load takes the job's own).
                loaded = zt.load(os.path.join(ckpt, f"step-{spec['k']:012d}"), scheduler=sched)
                result["loaded_step"] = loaded.step
            else:
                saved = torch.load(os.path.join(ckpt, f"rank{rank}.pt"))
                zt.load_state_dict(model, saved["model"])
                opt.load_state_dict(saved["opt"])
                sched.load_state_dict(saved["sched"])
        if phase == "first":
            done = zt_gpt.train(model, opt, sched, spec, 0, spec["k"], local, zt.average)
            for key, values in zip(("losses", "lrs", "beta1s"), done):
                result[key] += values
            if spec["save"] == "zt":
                zt.save(ckpt, scheduler=sched)
            else:
                os.makedirs(ckpt, exist_ok=True)
                # torch 1.13's OneCycleLR keeps its annealing function as a bound method, which
                # would pickle the scheduler with its optimizer and model: left out, as later
                # torch versions do.
                sched_state = {k: v for k, v in sched.state_dict().items() if not callable(v)}
                torch.save({"model": zt.full_state_dict(model), "opt": opt.state_dict(),
                            "sched": sched_state}, os.path.join(ckpt, f"rank{rank}.pt"))
            first = spec["k"]
        done = zt_gpt.train(model, opt, sched, spec, first, last, local, zt.average)
        for key, values in zip(("losses", "lrs", "beta1s"), done):
            result[key] += values
    result["warnings"] = [str(w.message) for w in caught]
    result["steps"] = tensor_steps(opt)
    result["state"] = zt.full_state_dict(model)
    torch.save(result, os.path.join(out, f"{phase}-rank{rank}.pt"))
    zt.shutdown()


if __name__ == "__main__":
    main()
