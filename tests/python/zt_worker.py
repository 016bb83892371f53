"""One rank of a front-end test job: shards a zt_models module with zerod.torch, trains it on its
part of each global batch and saves what the test compares (per-step losses, the full state dict,
the engine's memory against the plan, storage sizes at stage 3) to OUT/rank<R>.pt.

    zerorun -n N -- /usr/bin/python3 zt_worker.py '{"model": "nested", "stage": 3, ...}' OUT
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zt_models  # noqa: E402
import zerod.torch as zt  # noqa: E402


def storage_bytes(t):
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()


def fail_in_backward(grad):
    raise RuntimeError("a hook of the user's failed in backward")


def main():
    spec = json.loads(sys.argv[1])
    out = sys.argv[2]
    name = spec["model"]
    rank = zt.rank()
    model = zt_models.build_for_rank(name, spec.get("seed", 0), rank)
    device = torch.device(spec.get("device", "cpu"))
    model.to(device)
    kwargs = spec.get("shard", {})
    if "units" in spec:
        kwargs["units"] = {getattr(torch.nn, c) for c in spec["units"]}
    model, opt = zt.shard(model, stage=spec["stage"], dtype=spec.get("dtype", "fp32"),
                          lr=spec.get("lr", 1e-2), weight_decay=spec.get("weight_decay", 0.0),
                          optimizer=spec.get("optimizer", "adamw"),
                          max_grad_norm=spec.get("max_grad_norm", 0.0), **kwargs)
    world = zt.world_size()
    global_batch = spec.get("batch", 6)
    local = global_batch // world
    accumulation = kwargs.get("gradient_accumulation_steps", 1)
    losses = []
    applied = []  # per step: False when a gradient overflow skipped it (fp16)
    storage_during = []
    if spec.get("watch_storage"):
        # While the last top-level child runs, what do the first child's parameters hold?
        children = [m for m in model.children() if any(True for _ in m.parameters())]
        first, last = children[0], children[-1]

        def watch(module, inputs):
            storage_during.append({
                "released": [storage_bytes(p) for p in first.parameters()],
                "gathered": [storage_bytes(p) for p in last.parameters(recurse=False)]})
        last.register_forward_pre_hook(watch)
    # opt.zero_grad() takes torch's default for set_to_none unless the spec names one.
    zero_grad = {"set_to_none": spec["set_to_none"]} if "set_to_none" in spec else {}
    for step in range(spec["steps"]):
        opt.zero_grad(**zero_grad)
        step_loss = 0.0
        for micro in range(accumulation):
            x, y = zt_models.batch(name, step * accumulation + micro, global_batch,
                                   spec.get("data_seed", 0))
            x = x[rank * local:(rank + 1) * local].to(device)
            y = y[rank * local:(rank + 1) * local].to(device)
            loss = zt_models.loss_fn(name, model(x), y)
            if spec.get("penalty"):
                with zt.gathered(model):
                    loss = loss + spec["penalty"] * zt_models.l2(model)
            if spec.get("fail") == "user_hook" and step == 1:
                loss.register_hook(fail_in_backward)
            opt.backward(loss)
            if spec.get("fail") == "two_backwards" and step == 1:
                zt_models.loss_fn(name, model(x), y).backward()  # raises: no step in between
            if spec.get("fail") == "extra_collective" and step == 1 and rank == world - 1:
                zt.average(0.0)  # a collective the other ranks do not call
            step_loss += loss.item() / accumulation
        opt.step()
        applied.append(opt.last_step_applied)
        losses.append(zt.average(step_loss))
    stats = zt.memory_stats()
    after = {n: storage_bytes(p) for n, p in model.named_parameters()}
    state = zt.full_state_dict(model)
    buffers = {n: b.detach().float().clone() for n, b in model.named_buffers()}
    raw_buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    torch.save({"rank": rank, "world": world, "losses": losses, "loss_scale": opt.loss_scale,
                "applied": applied, "state": state, "stats": stats,
                "storage_after": after, "storage_during": storage_during, "buffers": buffers,
                "raw_buffers": raw_buffers},
               os.path.join(out, f"rank{rank}.pt"))
    zt.shutdown()


if __name__ == "__main__":
    main()
