"""The unsharded reference of a zt_worker job, computed in the test's own process.

One copy of the module per rank (copy.deepcopy of rank 0's, so per-rank buffers such as
BatchNorm's running statistics evolve on that rank's data only); each step, every copy takes the
master parameters, runs its rank's part of the batch forward and backward, the gradients are
averaged over ranks and accumulation steps (what DDP computes), clipped by the global norm if
asked, and torch.optim.AdamW/Adam steps the master parameters (those a backward reached: torch
skips a parameter whose grad is None)."""

import copy

import torch

import zt_models
from zerod.torch._optimizer import TORCH_SET_TO_NONE


def run(spec, world):
    name = spec["model"]
    master_model = zt_models.build(name, spec.get("seed", 0))
    replicas = [copy.deepcopy(master_model) for _ in range(world)]
    master = [p for p in master_model.parameters() if p.requires_grad]
    cls = torch.optim.AdamW if spec.get("optimizer", "adamw") == "adamw" else torch.optim.Adam
    opt = cls(master, lr=spec.get("lr", 1e-2), weight_decay=spec.get("weight_decay", 0.0))
    accumulation = spec.get("shard", {}).get("gradient_accumulation_steps", 1)
    global_batch = spec.get("batch", 6)
    local = global_batch // world
    # The workers' opt.zero_grad(): torch's default (False in 1.x, True from 2.0) unless named.
    set_to_none = spec.get("set_to_none", TORCH_SET_TO_NONE)
    losses = []
    for step in range(spec["steps"]):
        grads = [torch.zeros_like(p) for p in master]
        used = [False] * len(master)  # some replica's backward reached it this step
        step_loss = 0.0
        for micro in range(accumulation):
            x, y = zt_models.batch(name, step * accumulation + micro, global_batch,
                                   spec.get("data_seed", 0))
            for r, replica in enumerate(replicas):
                trainable = [p for p in replica.parameters() if p.requires_grad]
                with torch.no_grad():
                    for p, m in zip(trainable, master):
                        p.copy_(m)
                replica.zero_grad(set_to_none=True)  # grad None: not reached this step
                loss = zt_models.loss_fn(name, replica(x[r * local:(r + 1) * local]),
                                         y[r * local:(r + 1) * local])
                if spec.get("penalty"):
                    loss = loss + spec["penalty"] * zt_models.l2(replica)
                loss.backward()
                step_loss += loss.item() / (world * accumulation)
                for i, (g, p) in enumerate(zip(grads, trainable)):
                    if p.grad is not None:
                        g += p.grad
                        used[i] = True
        # As torch's zero_grad(set_to_none): with True, a parameter no backward reached this
        # step has grad None and is not stepped; with False, one reached on an earlier step
        # steps on zeros (one never reached keeps grad None either way).
        for p, g, u in zip(master, grads, used):
            if u or (p.grad is not None and not set_to_none):
                p.grad = g / (world * accumulation)
            elif set_to_none:
                p.grad = None
        if spec.get("max_grad_norm", 0.0) > 0:
            torch.nn.utils.clip_grad_norm_(master, spec["max_grad_norm"])
        opt.step()
        losses.append(step_loss)
    with torch.no_grad():
        for replica in replicas:
            for p, m in zip([p for p in replica.parameters() if p.requires_grad], master):
                p.copy_(m)
    # Rank r's state: the master parameters, rank r's own buffers.
    return {"states": [r.state_dict() for r in replicas], "losses": losses,
            "buffers": [dict(r.named_buffers()) for r in replicas]}
