"""One rank of a plan test job: shards a fresh module once per entry of a list of zt.shard
keyword arguments, each time recording the plan's and the engine's memory (or the error), then
leaves, and writes the list to OUT/rank<R>.json.

    zerorun -n N -- /usr/bin/python3 zt_plan_worker.py '{"runs": [{"stage": 2}, ...]}' OUT

(An object, since zerorun splits an argument that starts with '[' at its commas.)
"""

import json
import os
import sys

import torch
import torch.nn as nn

import zerod.torch as zt

LAYERS, WIDTH = 12, 64  # Linear(64, 64): 4160 fp32 parameters (16,640 bytes) each


def model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def main():
    results = []
    for kwargs in json.loads(sys.argv[1])["runs"]:
        try:
            zt.shard(model(), **kwargs)
        except zt.ZerodError as e:
            results.append({"error": e.code_name, "message": str(e)})
            continue
        stats = zt.memory_stats()
        results.append({key: stats[key] for key in ("stage", "planned_bytes", "allocated_bytes",
                                                    "planned_memory", "memory")})
        zt.shutdown()
    with open(os.path.join(sys.argv[2], f"rank{zt.rank()}.json"), "w") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
