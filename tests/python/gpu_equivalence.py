"""The front end on a GPU, without pytest (a lent GPU machine has its own Python and torch and may
lack pytest): zt_worker jobs on cuda:0 at stages 0-3, fp32 against the unsharded reference
computed here on the CPU, bf16 against fp32's loss curve. One GPU, so one rank per job (NCCL does
not put two ranks of a communicator on one device); stage 3 still gathers and releases every
unit. Prints one line per check and exits 1 if any failed.

    PYTHONPATH=python python3 tests/python/gpu_equivalence.py BUILD_DIR OUT_DIR
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import zt_reference  # noqa: E402


def main():
    build = pathlib.Path(sys.argv[1]).resolve()
    out = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("gpu_equivalence: torch sees no CUDA device: nothing checked")
        return 2
    work = pathlib.Path(tempfile.mkdtemp(prefix="zt-gpu-"))
    sock = work / "zerod.sock"
    daemon = subprocess.Popen([str(build / "bin" / "zerod"), "--socket", str(sock), "--listen",
                               "", "--data-dir", str(work / "data"), "--log-level", "warn"],
                              stdout=open(out / "zerod.log", "w"), stderr=subprocess.STDOUT)
    for _ in range(400):
        if sock.exists():
            break
        time.sleep(0.025)
    env = dict(os.environ, ZEROD_ENDPOINT=f"unix://{sock}", ZEROD_BUILD_DIR=str(build))
    failures = 0
    try:
        cases = [{"model": m, "stage": s, "steps": 4, "device": "cuda:0"}
                 for m in ("nested", "tied") for s in (0, 1, 2, 3)]
        cases += [{"model": "nested", "stage": s, "steps": 6, "device": "cuda:0", "dtype": d}
                  for s in (1, 3) for d in ("bf16", "fp16")]
        for i, spec in enumerate(cases):
            label = f"{spec['model']} stage {spec['stage']} {spec.get('dtype', 'fp32')}"
            result_dir = work / f"case{i}"
            result_dir.mkdir()
            done = subprocess.run([str(build / "bin" / "zerorun"), "-n", "1", "--job", f"gpu{i}",
                                   "--", sys.executable, str(HERE / "zt_worker.py"),
                                   json.dumps(spec), str(result_dir)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=300)
            (out / f"case{i}.log").write_text(done.stdout)
            if done.returncode != 0:
                print(f"FAIL {label}: exit {done.returncode} (case{i}.log)")
                failures += 1
                continue
            res = torch.load(result_dir / "rank0.pt")
            ref = zt_reference.run(dict(spec, dtype="fp32"), 1)
            if spec.get("dtype", "fp32") == "fp32":
                worst = max((res["state"][k].float() - v.float()).abs().max().item()
                            for k, v in ref["states"][0].items())
                ok = worst <= 1e-4
                print(f"{'ok  ' if ok else 'FAIL'} {label}: max |param - reference| {worst:.2e}"
                      f", allocated {res['stats']['allocated_bytes']} of planned "
                      f"{res['stats']['planned_bytes']}")
            else:
                worst = max(abs(a - b) / (0.02 + 0.02 * abs(b))
                            for a, b in zip(res["losses"], ref["losses"]))
                ok = worst <= 1.0
                print(f"{'ok  ' if ok else 'FAIL'} {label}: losses {res['losses']} vs fp32 "
                      f"{ref['losses']}")
            ok = ok and res["stats"]["allocated_bytes"] == res["stats"]["planned_bytes"]
            failures += 0 if ok else 1
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    print(f"gpu_equivalence: {len(cases) - failures} of {len(cases)} ok")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
