"""Trains the GPT of gpt_model.py character by character on a text file, under zerod.torch.

    zerod --socket /tmp/zerod.sock --listen "" --data-dir /tmp/zerod-data &
    ZEROD_ENDPOINT=unix:///tmp/zerod.sock PYTHONPATH=python \\
        build/bin/zerorun -n 2 --job gpt1 -- /usr/bin/python3 examples/torch/gpt.py --stage 3
    PYTHONPATH=python /usr/bin/python3 examples/torch/gpt.py --reference   # unsharded, no zerod

Every rank builds the same model and reads the same global batch of each step, then takes its
own rows of it; gradients are averaged over the ranks, so N ranks train as one process on the
whole batch would (--reference is that process). Rank 0 prints `step S loss L time T ms` per step
(the loss averaged over the ranks: the global batch's) and, at the end, one JSON line.

Checkpoints and elastic runs: --checkpoint-dir D --checkpoint-every N saves with zt.save every N
steps; under `zerorun --max-restarts K` it also takes an in-memory snapshot every step
(zt.snapshot, --snapshot-every), and a restarted world resumes from the newest of the two
(zt.resume): step S trains on global batch S whatever the world, so no sample is skipped or seen
twice. --kill-rank-at R:K is failure injection (rank R kills itself after step K, first attempt).
"""

import argparse
import json
import os
import signal
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_model import GPT, Block, CharData, loss_fn  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", default="3", choices=["0", "1", "2", "3", "auto"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=8, help="global batch (divides by world size)")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--units", default="default", choices=["default", "block", "module"],
                   help="stage-3 gather units: zt.shard's default (each repeated block, and "
                        "every module with parameters outside blocks), Block (the parameters "
                        "outside blocks in the root's unit), or every module with parameters")
    p.add_argument("--checkpoint-activations", default="", choices=["", "reentrant",
                                                                     "non-reentrant"],
                   help="recompute each block's activations in backward (torch.utils."
                        "checkpoint): the memory of one block's activations instead of all")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (each rank its GPU)")
    p.add_argument("--sample", type=int, default=0, help="characters to generate after training")
    p.add_argument("--checkpoint-dir", help="root of the durable checkpoints (zt.save)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between saves (0: none)")
    p.add_argument("--keep-last", type=int, default=2, help="checkpoints kept (0: all)")
    p.add_argument("--snapshot-every", type=int, default=1,
                   help="steps between in-memory snapshots under zerorun --max-restarts (0: none)")
    p.add_argument("--resume", action="store_true",
                   help="start from the newest checkpoint (always after a restart)")
    p.add_argument("--kill-rank-at", default="",
                   help="failure injection R:K: on the first attempt rank R kills itself after "
                        "step K")
    p.add_argument("--reference", action="store_true",
                   help="train unsharded in this one process (torch.optim.AdamW), without zerod")
    args = p.parse_args()
    args.stage = args.stage if args.stage == "auto" else int(args.stage)
    if args.reference and args.dtype != "fp32":
        p.error("--reference trains in fp32 only")
    if args.dtype == "fp16" and not fp16_layer_norm_works(args.device):
        p.error(f"--dtype fp16: this torch has no fp16 LayerNorm on {args.device} (torch 1.x "
                "on the CPU): use bf16, or --device cuda")
    return p, args


def fp16_layer_norm_works(device):
    try:
        torch.nn.functional.layer_norm(torch.ones(1, 2, dtype=torch.half, device=device), (2,))
        return True
    except RuntimeError:
        return False


@torch.no_grad()
def generate(model, data, count, context, device):
    """Greedy decoding from a newline. At stage 3 each forward is collective (it gathers the
    units), so every rank must call this with the same count, even though only rank 0 prints."""
    start = data.chars.index("\n") if "\n" in data.chars else 0
    idx = torch.tensor([[start]], device=device)
    for _ in range(count):
        logits = model(idx[:, -context:])
        idx = torch.cat([idx, logits[:, -1].float().argmax(-1, keepdim=True)], dim=1)
    return "".join(data.chars[i] for i in idx[0, 1:].tolist())


def main():
    parser, args = parse_args()
    data = CharData(args.text)
    torch.manual_seed(args.seed)
    model = GPT(data.vocab, args.context, args.width, args.layers, args.heads,
                checkpoint=args.checkpoint_activations or None)
    params = sum(p.numel() for p in model.parameters())  # the tied weight counts once

    if args.device.startswith("cuda") and "ZEROD_LOCAL_RANK" in os.environ:
        # One GPU per local rank, as zerorun numbers them (torchrun's LOCAL_RANK).
        args.device = f"cuda:{int(os.environ['ZEROD_LOCAL_RANK']) % torch.cuda.device_count()}"
    model.to(args.device)
    if args.reference:
        zt = None
        rank, world = 0, 1
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        average, backward = float, torch.Tensor.backward
    else:
        import zerod.torch as zt
        rank, world = zt.rank(), zt.world_size()  # from zerorun's environment, before joining
        if args.batch % world:
            parser.error(f"--batch {args.batch} does not divide by the world size {world}")
        # By default each Block is one gather unit (one gather of all its tensors per forward
        # and per backward at stage 3), and wpe and ln_f are units of their own. The head's
        # weight IS wte's weight (tied), used at the start and at the end of GPT.forward, so it
        # goes to the root's unit, which encloses both uses and stays gathered through the whole
        # forward. --units block puts every parameter outside Blocks in the root's unit;
        # "module" makes every module with parameters a unit.
        units = {"default": None, "block": {Block},
                 "module": lambda name, module: len(module._parameters) > 0}[args.units]
        model, opt = zt.shard(model, stage=args.stage, dtype=args.dtype, lr=args.lr,
                              weight_decay=args.weight_decay, optimizer="adamw", units=units)
        average, backward = zt.average, opt.backward  # opt.backward scales the loss for fp16

    local = args.batch // world
    first = 0
    attempt = int(os.environ.get("ZEROD_RESTART", "0"))
    if zt is not None and (args.resume or attempt > 0):
        start = time.perf_counter()
        ckpt = zt.resume(args.checkpoint_dir)
        if ckpt is not None:
            first = ckpt.step
            print(f"rank {rank}: resumed from step {ckpt.step} ({ckpt.directory}) in "
                  f"{(time.perf_counter() - start) * 1000:.1f} ms", flush=True)
    kill_rank, kill_step = (int(v) for v in args.kill_rank_at.split(":")) \
        if args.kill_rank_at else (-1, -1)
    times, loss, sent_after_first = [], float("nan"), 0
    for step in range(first, args.steps):
        start = time.perf_counter()
        x, y = data.batch(step, args.batch, args.context, args.seed)  # the global batch
        x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        x, y = x.to(args.device), y.to(args.device)
        opt.zero_grad()
        local_loss = loss_fn(model(x), y)
        backward(local_loss)
        opt.step()
        loss = average(local_loss.item())  # a collective: also waits for the slowest rank
        times.append((time.perf_counter() - start) * 1000)
        if rank == 0:
            print(f"step {step} loss {loss:.6f} time {times[-1]:.1f} ms", flush=True)
        if zt is not None and step == first:
            sent_after_first = sum(zt.memory_stats()["bytes_sent"].values())
        if zt is not None:
            done = step + 1  # optimizer steps taken: the checkpoint's step
            if args.snapshot_every and done % args.snapshot_every == 0:
                try:
                    zt.snapshot()
                except zt.ZerodError as e:  # shared memory full: the durable checkpoint remains
                    print(f"rank {rank}: snapshot of step {done} skipped: {e}", file=sys.stderr,
                          flush=True)
            if args.checkpoint_dir and args.checkpoint_every and done % args.checkpoint_every == 0:
                zt.save(args.checkpoint_dir, keep_last=args.keep_last)
            if attempt == 0 and rank == kill_rank and done == kill_step:
                print(f"rank {rank}: failure injection: SIGKILL after step {done}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    result = {"final_loss": loss, "stage": None if zt is None else args.stage,
              "checkpoint_activations": args.checkpoint_activations or None,
              "world_size": world, "dtype": args.dtype, "params": params,
              "step_time_ms": round(statistics.median(times[1:] or times), 3) if times else None}
    if zt is None:
        result["reference"] = True
    else:
        stats = zt.memory_stats()
        # bytes_sent counts every collective since joining (the initial broadcast too): the
        # steps after the first give the steady state.
        sent = sum(stats["bytes_sent"].values()) - sent_after_first
        result.update(stage=stats["stage"],
                      model_state_bytes_per_rank=stats["model_state_bytes"],
                      allocated_bytes_per_rank=stats["allocated_bytes"],
                      peak_gather_buffers=stats["peak_gather_buffers"],
                      gather_overflows=stats["gather_overflows"],
                      bytes_sent_per_step=sent // max(1, args.steps - first - 1),
                      first_step=first)
    if args.sample > 0:
        text = generate(model, data, args.sample, args.context, args.device)
        if rank == 0:
            print(text, flush=True)
    if rank == 0:
        print(json.dumps(result), flush=True)  # the last line
    if zt is not None:
        zt.shutdown()


if __name__ == "__main__":
    main()
