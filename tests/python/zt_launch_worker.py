"""One rank of a launch test, however it was started: torchrun's variables, zerorun's, or none (a
single process). Shards a zt_models module, trains it on the rows of each global batch that
torch's DistributedSampler gives this rank (through the default process group zt.shard made), sums
the loss over ranks with dist.all_reduce as metrics code does, and saves what the test compares
to OUT/rank<R>.pt, with where zerod was loaded from.

    python3 zt_launch_worker.py '{"model": "nested", "stage": 3, "steps": 3}' OUT
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zt_models  # noqa: E402
import zerod  # noqa: E402
import zerod._native  # noqa: E402
import zerod.torch as zt  # noqa: E402
from zerod.torch import _launch  # noqa: E402


def embedded_zerod():
    """The zerod this rank started for the run, if any: its endpoint, folder and process."""
    z = _launch._state.coordinator if _launch._state is not None else None
    return None if z is None else {"endpoint": z.endpoint, "folder": z.folder,
                                   "pid": z.process.pid}


def main(spec, out):
    name = spec["model"]
    rank = zt.rank()
    model = zt_models.build_for_rank(name, spec.get("seed", 0), rank)
    model, opt = zt.shard(model, stage=spec["stage"], lr=spec.get("lr", 1e-2),
                          weight_decay=spec.get("weight_decay", 0.0))
    group = zt.process_group()
    world = dist.get_world_size(group)
    losses, rows_seen = [], []
    for step in range(spec["steps"]):
        x, y = zt_models.batch(name, step, spec.get("batch", 6), spec.get("data_seed", 0))
        rows = list(DistributedSampler(TensorDataset(x, y), shuffle=False))
        rows_seen.append(rows)
        opt.zero_grad()
        loss = zt_models.loss_fn(name, model(x[rows]), y[rows])
        loss.backward()
        opt.step()
        total = torch.tensor([loss.item()])
        dist.all_reduce(total)
        losses.append(total.item() / world)
    state = zt.full_state_dict(model)
    torch.save({"rank": zt.rank(), "world": zt.world_size(), "group_world": world,
                "backend": dist.get_backend(), "losses": losses, "rows": rows_seen,
                "state": state, "package": zerod.__file__,
                "library": zerod._native._library_path(), "zerod": embedded_zerod()},
               os.path.join(out, f"rank{rank}.pt"))
    zt.shutdown()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
