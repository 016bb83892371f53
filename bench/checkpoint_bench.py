"""checkpoint_bench: sharded checkpoints of train_mlp against the disk they are written to, and the
time an elastic job takes from a rank's death to its first step after the restart.

    /usr/bin/python3 bench/checkpoint_bench.py [--dir DIR] [--hidden 2048] [--layers 8] [--ranks 2]

Measured in one run, on the same directory (default: a fresh one under $TMPDIR):
  - the disk: dd writes a file as large as the checkpoint in 8 MiB blocks with conv=fsync, and
    reads it back cold (its pages dropped with posix_fadvise(DONTNEED), no root needed);
  - save: `train_mlp --checkpoint-every` at stage 2, bf16 (fp32 master + Adam m, v: 12 bytes per
    parameter), the time rank 0 reports for the whole save (every rank's file written, fsync'd
    and renamed, the manifest, the coordinator's record);
  - load: `train_mlp --resume` at the same world and at one rank more (resharded), pages dropped
    first, the slowest rank's time: whole (choosing, the ranks' agreement, reading, and the cast
    and all-gather that rebuild the bf16 parameters, as a step's end does) and its reading alone
    (the part the disk bounds);
  - recovery: `zerorun --max-restarts 1` with rank 1 killed (SIGKILL) after step 3, once from the
    in-memory snapshot (/dev/shm) and once from disk (--snapshot-every 0, a checkpoint every
    step): from zerorun seeing the death to every rank of the new world having restored its
    state, and to rank 0 printing the first step of the new world (one step's time later). From
    disk, the bench drops the checkpoint's pages as soon as zerorun reports the death, so the
    restart reads the disk. Then the same with examples/torch/gpt.py (its default GPT, stage 3,
    zt.snapshot / zt.save / zt.resume), where a restarted rank also starts Python and torch.

Needs build/bin/{zerod,zerorun,train_mlp}. Prints a table, then one JSON line.
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MIB = 2.0 ** 20


def drop_pages(path):
    """Drops the page cache of every file under `path` (ours, so no root is needed)."""
    paths = [path] if os.path.isfile(path) else [
        os.path.join(d, f) for d, _, files in os.walk(path) for f in files]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def dd_bandwidth(directory, size_bytes):
    """Sequential write (fsync'd) and cold read of one file, in bytes/s."""
    path = os.path.join(directory, "dd.bin")
    count = max(1, int(size_bytes // (8 * MIB)))
    start = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=8M", f"count={count}",
                    "conv=fsync"], check=True, capture_output=True)
    write_s = time.monotonic() - start
    drop_pages(path)
    start = time.monotonic()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=8M"], check=True,
                   capture_output=True)
    read_s = time.monotonic() - start
    os.unlink(path)
    total = count * 8 * MIB
    return total / write_s, total / read_s


class Daemon:
    def __init__(self, build, workdir):
        self.socket = os.path.join(workdir, "zerod.sock")
        self.proc = subprocess.Popen(
            [str(build / "bin/zerod"), "--socket", self.socket, "--listen", "",
             "--data-dir", os.path.join(workdir, "state"), "--log-level", "warn"])
        for _ in range(200):
            if os.path.exists(self.socket):
                return
            time.sleep(0.05)
        raise RuntimeError("zerod did not start")

    @property
    def endpoint(self):
        return "unix://" + self.socket

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def run_job(build, daemon, job, ranks, trainer_args, zerorun_args=(), on_line=None,
            trainer=None):
    """Runs zerorun; returns [(seconds since start, line)] of its stdout and stderr, calling
    on_line(line) as each arrives."""
    argv = [str(build / "bin/zerorun"), "-n", str(ranks), "--endpoint", daemon.endpoint,
            "--job", job, *zerorun_args, "--", *(trainer or [str(build / "bin/train_mlp")]),
            *trainer_args]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    lock = threading.Lock()

    def pump(stream):
        for line in stream:
            with lock:
                lines.append((time.monotonic() - start, line.rstrip("\n")))
            if on_line is not None:
                on_line(line)

    threads = [threading.Thread(target=pump, args=(s,)) for s in (proc.stdout, proc.stderr)]
    for t in threads:
        t.start()
    code = proc.wait()
    for t in threads:
        t.join()
    if code != 0:
        sys.stderr.write("\n".join(l for _, l in lines[-30:]) + "\n")
        raise RuntimeError(f"job {job} exited with {code}")
    return sorted(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", help="where checkpoints and the dd file go (default: under $TMPDIR)")
    p.add_argument("--build", default=str(ROOT / "build"))
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    build = pathlib.Path(args.build)
    base = args.dir or tempfile.mkdtemp(prefix="zerod-ckpt-bench-")
    os.makedirs(base, exist_ok=True)
    work = tempfile.mkdtemp(prefix="zerod-ckpt-bench-daemon-")
    daemon = Daemon(build, work)
    model = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--dtype", "bf16",
             "--stage", "2", "--batch", "48", "--seed", "1"]
    results = {"ranks": args.ranks, "hidden": args.hidden, "layers": args.layers}
    try:
        root = os.path.join(base, "ckpt")
        lines = run_job(build, daemon, "save", args.ranks,
                        model + ["--steps", "2", "--checkpoint-dir", root,
                                 "--checkpoint-every", "2"])
        saved = [re.search(r"saved step 2 to \S+: (\d+) bytes in ([\d.]+) ms", l)
                 for _, l in lines]
        saved = [m for m in saved if m][0]
        ckpt_bytes, save_ms = int(saved.group(1)), float(saved.group(2))
        results["checkpoint_bytes"] = ckpt_bytes
        results["save_bytes_per_s"] = ckpt_bytes / (save_ms / 1e3)
        dd_write, dd_read = dd_bandwidth(base, ckpt_bytes)
        results["dd_write_bytes_per_s"], results["dd_read_bytes_per_s"] = dd_write, dd_read

        for world, name in ((args.ranks, "load"), (args.ranks + 1, "load_resharded")):
            drop_pages(root)
            # Job "save" run again: a root load takes only the job's own checkpoints.
            lines = run_job(build, daemon, "save", world,
                            model + ["--steps", "3", "--checkpoint-dir", root, "--resume"])
            found = [m for m in (re.search(r"resumed from step 2 .* in ([\d.]+) ms \(reading "
                                           r"([\d.]+) ms\)", l) for _, l in lines) if m]
            results[f"{name}_ranks"] = world
            results[f"{name}_bytes_per_s"] = ckpt_bytes / (max(float(m.group(1)) for m in found) / 1e3)
            results[f"{name}_read_bytes_per_s"] = ckpt_bytes / (
                max(float(m.group(2)) for m in found) / 1e3)

        recover = os.path.join(base, "recover")

        def cold(line):
            # The restart reads the disk, not the pages the save left in the cache.
            if "zerorun: rank 1 exited" in line:
                for d in (recover, os.path.join(base, "recover-gpt")):
                    if os.path.isdir(d):
                        drop_pages(d)

        for source, extra in (("memory", ["--snapshot-every", "1"]),
                              ("disk", ["--snapshot-every", "0", "--checkpoint-every", "1",
                                        "--checkpoint-dir", recover])):
            lines = run_job(build, daemon, f"recover-{source}", args.ranks,
                            model + ["--steps", "5", "--kill-rank-at", "1:3"] + extra,
                            ["--max-restarts", "1"], on_line=cold)
            death = next(t for t, l in lines if re.search(r"zerorun: rank 1 exited", l))
            restored = max(t for t, l in lines if t > death and "resumed from step 3" in l)
            first = next(t for t, l in lines if t > death and re.match(r"\[rank 0\] step 4 ", l))
            results[f"recovery_from_{source}_restored_s"] = restored - death
            results[f"recovery_from_{source}_s"] = first - death

        # The same on the GPT of examples/torch (zerod.torch: zt.snapshot, zt.save, zt.resume),
        # where a restarted rank also starts Python and imports torch.
        gpt = ["/usr/bin/python3", str(ROOT / "examples/torch/gpt.py")]
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python"),
                                                    os.environ.get("PYTHONPATH", "")])
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        recover = os.path.join(base, "recover-gpt")
        for source, extra in (("memory", ["--snapshot-every", "1"]),
                              ("disk", ["--snapshot-every", "0", "--checkpoint-every", "1",
                                        "--checkpoint-dir", recover])):
            lines = run_job(build, daemon, f"recover-gpt-{source}", args.ranks,
                            ["--steps", "6", "--stage", "3", "--kill-rank-at", "1:3"] + extra,
                            ["--max-restarts", "1"], on_line=cold, trainer=gpt)
            death = next(t for t, l in lines if re.search(r"zerorun: rank 1 exited", l))
            restored = max(t for t, l in lines if t > death and "resumed from step 3" in l)
            first = next(t for t, l in lines if t > death and re.match(r"\[rank 0\] step 3 ", l))
            results[f"gpt_recovery_from_{source}_restored_s"] = restored - death
            results[f"gpt_recovery_from_{source}_s"] = first - death
    finally:
        daemon.stop()

    gbs = lambda v: f"{v / 1e9:6.2f} GB/s"  # noqa: E731
    print(f"checkpoint of {args.ranks} ranks: {results['checkpoint_bytes'] / MIB:.1f} MiB "
          f"(train_mlp --hidden {args.hidden} --layers {args.layers}, bf16, stage 2) in {base}")
    print(f"  disk (dd, same dir)   write {gbs(results['dd_write_bytes_per_s'])}   "
          f"read cold {gbs(results['dd_read_bytes_per_s'])}")
    print(f"  save                  {gbs(results['save_bytes_per_s'])}   "
          f"= {results['save_bytes_per_s'] / results['dd_write_bytes_per_s']:.2f} x dd write")
    for name in ("load", "load_resharded"):
        v, r = results[f"{name}_bytes_per_s"], results[f"{name}_read_bytes_per_s"]
        dd = results["dd_read_bytes_per_s"]
        print(f"  {name:<21} {gbs(v)}   = {v / dd:.2f} x dd read ({results[name + '_ranks']} "
              f"ranks); reading the files alone {gbs(r)} = {r / dd:.2f} x")
    for model_name, prefix in (("train_mlp", ""), ("GPT", "gpt_")):
        for source in ("memory", "disk"):
            print(f"  {model_name} recovery from {source:<7} death -> state restored on every "
                  f"rank {results[f'{prefix}recovery_from_{source}_restored_s']:.2f} s, -> first "
                  f"step done {results[f'{prefix}recovery_from_{source}_s']:.2f} s")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
