"""Trains torchvision's resnet18 (10 classes) on synthetic images under zerod.torch.

    zerod --socket /tmp/zerod.sock --listen "" --data-dir /tmp/zerod-data &
    ZEROD_ENDPOINT=unix:///tmp/zerod.sock PYTHONPATH=python \\
        build/bin/zerorun -n 2 --job resnet1 -- /usr/bin/python3 examples/torch/resnet.py --stage 2

The images of step S are random, drawn from a generator seeded with S (the same global batch on
every rank; each rank takes its rows): each is one random colour plus pixel noise, labelled by a
fixed random linear "teacher" of that colour, so there is something to learn within a few steps
and the loss falls (from about ln 10 = 2.3 to about 1.5 in 10 steps).

BatchNorm's running statistics are buffers, not parameters: zerod does not shard them, and like
DDP without SyncBatchNorm each rank keeps its own, updated on its own rows (and in training mode
each rank normalizes with its local batch's statistics). So N ranks do not compute exactly what
one process on the global batch would, and there is no --reference mode here (gpt.py has one).
"""

import argparse
import os
import json
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision

import zerod.torch as zt

CLASSES = 10


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", default="3", choices=["0", "1", "2", "3", "auto"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8, help="global batch (divides by world size)")
    p.add_argument("--image", type=int, default=32, help="image side in pixels")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--units", default="module", choices=["module", "block"],
                   help="stage-3 gather units: every module with parameters, or each BasicBlock "
                        "(the stem and the classifier then form the root's unit)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (each rank its GPU)")
    args = p.parse_args()
    args.stage = args.stage if args.stage == "auto" else int(args.stage)
    if args.dtype == "fp16" and not fp16_conv_works(args.device):
        p.error(f"--dtype fp16: this torch has no fp16 convolution on {args.device} (torch 1.x "
                "on the CPU): use bf16, or --device cuda")
    return p, args


def fp16_conv_works(device):
    try:
        F.conv2d(torch.ones(1, 1, 2, 2, dtype=torch.half, device=device),
                 torch.ones(1, 1, 1, 1, dtype=torch.half, device=device))
        return True
    except RuntimeError:
        return False


class Synthetic:
    """Deterministic images and teacher labels: batch(step) is the same in every process."""

    def __init__(self, side, seed):
        self.side, self.seed = side, seed
        g = torch.Generator().manual_seed(seed)
        self.teacher = torch.randn(3, CLASSES, generator=g)

    def batch(self, step, size):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + 1 + step)
        colour = torch.randn(size, 3, generator=g)
        y = (colour @ self.teacher).argmax(1)
        x = colour[:, :, None, None] + 0.5 * torch.randn(size, 3, self.side, self.side, generator=g)
        return x, y


def main():
    parser, args = parse_args()
    rank, world = zt.rank(), zt.world_size()  # from zerorun's environment, before joining
    if args.batch % world:
        parser.error(f"--batch {args.batch} does not divide by the world size {world}")
    if args.device.startswith("cuda"):
        # One GPU per local rank, as zerorun numbers them (torchrun's LOCAL_RANK).
        local_rank = int(os.environ.get("ZEROD_LOCAL_RANK", rank))
        args.device = f"cuda:{local_rank % torch.cuda.device_count()}"
    torch.manual_seed(args.seed)  # only rank 0's initial values matter: zt.shard sends them
    model = torchvision.models.resnet18(num_classes=CLASSES).to(args.device)
    params = sum(p.numel() for p in model.parameters())
    units = {torchvision.models.resnet.BasicBlock} if args.units == "block" else None
    model, opt = zt.shard(model, stage=args.stage, dtype=args.dtype, lr=args.lr,
                          weight_decay=args.weight_decay, optimizer="adamw", units=units)
    data = Synthetic(args.image, args.seed)

    local = args.batch // world
    times, loss, sent_after_first = [], float("nan"), 0
    for step in range(args.steps):
        start = time.perf_counter()
        x, y = data.batch(step, args.batch)  # the global batch; this rank's rows:
        x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        x, y = x.to(args.device), y.to(args.device)
        opt.zero_grad()
        # zt.shard casts floating inputs to bf16/fp16 (cast_forward_inputs); the loss in fp32.
        local_loss = F.cross_entropy(model(x).float(), y)
        opt.backward(local_loss)  # loss.backward(), with loss scaling at fp16
        opt.step()
        loss = zt.average(local_loss.item())  # a collective: also waits for the slowest rank
        times.append((time.perf_counter() - start) * 1000)
        if rank == 0:
            print(f"step {step} loss {loss:.6f} time {times[-1]:.1f} ms", flush=True)
        if step == 0:
            sent_after_first = sum(zt.memory_stats()["bytes_sent"].values())

    stats = zt.memory_stats()
    sent = sum(stats["bytes_sent"].values()) - sent_after_first  # the steps after the first
    result = {"final_loss": loss, "stage": stats["stage"], "world_size": world,
              "dtype": args.dtype, "params": params,
              "step_time_ms": round(statistics.median(times[1:] or times), 3) if times else None,
              "model_state_bytes_per_rank": stats["model_state_bytes"],
              "allocated_bytes_per_rank": stats["allocated_bytes"],
              "bytes_sent_per_step": sent // max(1, args.steps - 1)}
    if rank == 0:
        print(json.dumps(result), flush=True)
    zt.shutdown()


if __name__ == "__main__":
    main()
