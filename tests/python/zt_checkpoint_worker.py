"""One rank of a checkpoint test job: a module with a BatchNorm and a frozen layer, trained on a
fixed sequence of global batches whatever the world size.

Each global batch is MICRO micro-batches of 2 samples; rank r of w ranks takes micro-batches
r*a .. r*a+a-1 with a = MICRO / w accumulation steps, so every world size computes the same
BatchNorm statistics (per micro-batch) and the same averaged gradient, and the losses of any two
world sizes agree within fp32 rounding.

    zerorun -n N -- /usr/bin/python3 zt_checkpoint_worker.py '{"phase": "first", ...}' OUT
phase "first": trains `k` steps, zt.save(ckpt), trains `n` more; phase "resume": zt.load(ckpt),
trains the same `n` steps. Writes OUT/<phase>-rank<R>.pt: the losses and the buffers.
"""

import json
import os
import sys

import torch
import torch.nn as nn

import zerod.torch as zt

MICRO = 6
IN, OUT = 7, 5


class BatchNormFrozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(IN, 12)
        self.frozen.requires_grad_(False)
        self.fc = nn.Linear(12, 12, bias=False)
        self.bn = nn.BatchNorm1d(12)
        self.out = nn.Linear(12, OUT)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(torch.tanh(self.frozen(x))))))


def micro_batch(step, m):
    g = torch.Generator().manual_seed(1000 * step + m)
    return torch.randn(2, IN, generator=g), torch.randint(0, OUT, (2,), generator=g)


def buffers(model):
    return {n: b.detach().clone() for n, b in model.named_buffers()}


def train(model, opt, first_step, steps, rank, world):
    accumulation = MICRO // world
    losses = []
    for step in range(first_step, first_step + steps):
        opt.zero_grad()
        total = 0.0
        for j in range(accumulation):
            x, y = micro_batch(step, rank * accumulation + j)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            total += loss.item() / accumulation
        opt.step()
        losses.append(zt.average(total))
    return losses


def main():
    spec = json.loads(sys.argv[1])
    out = sys.argv[2]
    rank, world = zt.rank(), zt.world_size()
    # Every rank of the resumed job starts from other values: all must come from the checkpoint.
    torch.manual_seed(spec.get("seed", 0) + rank)
    model = BatchNormFrozen()
    model, opt = zt.shard(model, stage=spec["stage"], lr=1e-2, weight_decay=0.0,
                          gradient_accumulation_steps=MICRO // world)
    result = {"rank": rank, "world": world, "job": os.environ.get("ZEROD_JOB")}
    if spec["phase"] == "first":
        result["nothing"] = zt.load(os.path.join(spec["ckpt"], "none-yet"))
        train(model, opt, 0, spec["k"], rank, world)
        result["saved_buffers"] = buffers(model)
        result["frozen"] = model.frozen.weight.detach().clone()
        result["directory"] = zt.save(spec["ckpt"], keep_last=1,
                                      user={"epoch": 1, "batch": spec["k"]})
        first = spec["k"]
    else:
        ckpt = zt.load(spec["ckpt"])
        result["loaded"] = tuple(ckpt)
        result["loaded_buffers"] = buffers(model)
        result["frozen"] = model.frozen.weight.detach().clone()
        first = ckpt.user["batch"]
    result["losses"] = train(model, opt, first, spec["n"], rank, world)
    result["end_buffers"] = buffers(model)
    torch.save(result, os.path.join(out, f"{spec['phase']}-rank{rank}.pt"))
    zt.shutdown()


if __name__ == "__main__":
    main()
