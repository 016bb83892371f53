#!/usr/bin/python3
"""Generates the Adam/AdamW conformance vectors in tests/testdata/adam/ with torch.optim.

Run with Debian's interpreter, which is the one that sees python3-torch:

    /usr/bin/python3 scripts/make_adam_vectors.py                 # rewrite tests/testdata/adam/
    /usr/bin/python3 scripts/make_adam_vectors.py --out DIR       # write elsewhere
    /usr/bin/python3 scripts/make_adam_vectors.py --check DIR     # regenerate, compare with DIR

The output is a pure function of the case table below: inputs come from Python's own seeded
generator (not torch's, whose streams change between versions), and torch runs on its portable
kernels (ATEN_CPU_CAPABILITY=default) on one thread, so the bytes do not depend on the machine's
vector units. Format and cases: tests/testdata/adam/README.md.
"""

import argparse
import json
import math
import os
import pathlib
import random
import re
import struct
import sys
import tempfile

# torch's AVX2/AVX-512 kernels are compiled with contraction allowed, so the last bit of a result
# could depend on the CPU; the default kernels give the same bits everywhere. Must precede import.
os.environ["ATEN_CPU_CAPABILITY"] = "default"

try:
    import torch
except ImportError as error:
    sys.exit(f"make_adam_vectors.py: torch is not importable by {sys.executable} ({error}); "
             "install Debian's python3-torch and run with /usr/bin/python3")

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "tests" / "testdata" / "adam"
NAME = re.compile(r"^adamw?_seed\d+_n\d+\.json$")

# seed, algorithm, numel, steps, lr, beta1, beta2, eps, weight_decay, gradient scale.
# "span": each element's magnitude is log-uniform in [1e-3, 1e3]; a number: every magnitude is that
# number times U(0.5, 1.5), so that the error bound (relative to the largest magnitude) looks at
# the small and the large end on their own.
CASES = [
    (0, "adam", 1, 8, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1e-3),
    (1, "adamw", 1, 8, 3e-4, 0.95, 0.95, 1e-6, 0.1, 1e3),
    (2, "adam", 7, 40, 1e-2, 0.9, 0.99, 1e-8, 0.0, "span"),
    (3, "adamw", 7, 40, 5e-5, 0.95, 0.999, 1e-6, 0.1, "span"),
    (4, "adam", 257, 10, 1e-2, 0.95, 0.999, 1e-8, 0.01, "span"),
    (5, "adamw", 257, 10, 5e-5, 0.8, 0.99, 1e-6, 0.0, "span"),
    (6, "adam", 1000, 6, 1e-3, 0.95, 0.99, 1e-8, 0.01, "span"),
    (7, "adamw", 1000, 6, 1e-3, 0.9, 0.95, 1e-6, 0.01, 1e-3),
    (8, "adam", 4099, 4, 1e-3, 0.8, 0.95, 1e-8, 0.1, "span"),
    (9, "adamw", 4099, 4, 3e-4, 0.9, 0.999, 1e-6, 0.01, "span"),
    (10, "adam", 7, 12, 1e-1, 0.9, 0.999, 1e-3, 0.5, 1e-2),
    (11, "adamw", 7, 12, 1.0, 0.0, 0.9, 1e-8, 0.2, "span"),
]


def f32(x):
    """The float32 nearest to x, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fmt(x):
    """9 significant digits: enough for every float32 to parse back to itself."""
    if not math.isfinite(x):
        raise ValueError(f"non-finite value {x} has no JSON spelling")
    text = "%.9g" % x
    return text if "." in text or "e" in text else text + ".0"


def floats(values):
    return "[" + ",".join(fmt(v) for v in values) + "]"


def inputs(seed, numel, steps, scale):
    rng = random.Random(seed)
    param = [f32(rng.uniform(-1.0, 1.0)) for _ in range(numel)]
    if scale == "span":
        magnitude = [10.0 ** rng.uniform(-3.0, 3.0) for _ in range(numel)]
    else:
        magnitude = [scale] * numel
    grads = []
    for _ in range(steps):
        step = []
        for i in range(numel):
            if numel > 1 and i == 0:
                step.append(0.0)  # m and v stay zero: the update is eps's (and decay's) alone
            elif numel > 1 and i == 1:
                step.append(f32(1e-30))  # g*g underflows to zero; m does not
            elif numel > 1 and rng.random() < 0.05:
                step.append(0.0)
            else:
                sign = -1.0 if rng.random() < 0.5 else 1.0
                step.append(f32(sign * magnitude[i] * rng.uniform(0.5, 1.5)))
        grads.append(step)
    return param, grads


def case_text(case):
    seed, algorithm, numel, steps, lr, beta1, beta2, eps, weight_decay, scale = case
    param0, grads = inputs(seed, numel, steps, scale)
    param = torch.nn.Parameter(torch.tensor(param0, dtype=torch.float32))
    kind = torch.optim.Adam if algorithm == "adam" else torch.optim.AdamW
    optimizer = kind([param], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay,
                     foreach=False)
    after = []
    for grad in grads:
        param.grad = torch.tensor(grad, dtype=torch.float32)
        optimizer.step()
        state = optimizer.state[param]
        after.append((param.detach().tolist(), state["exp_avg"].tolist(),
                      state["exp_avg_sq"].tolist()))
    lines = [
        '{"producer":"torch.optim.%s (torch %s, foreach=False)",' % (kind.__name__,
                                                                      torch.__version__),
        '"algorithm":"%s","weight_decay_mode":"%s","seed":%d,' %
        (algorithm, "l2" if algorithm == "adam" else "decoupled", seed),
        '"hyper":{"lr":%r,"beta1":%r,"beta2":%r,"eps":%r,"weight_decay":%r},' %
        (lr, beta1, beta2, eps, weight_decay),
        '"numel":%d,"steps":%d,' % (numel, steps),
        '"initial_param":%s,' % floats(param0),
        '"grads":[',
        ",\n".join(floats(g) for g in grads),
        '],',
        '"after_step":[',
        ",\n".join('{"param":%s,"exp_avg":%s,"exp_avg_sq":%s}' %
                   (floats(p), floats(m), floats(v)) for p, m, v in after),
        ']}',
    ]
    return "\n".join(lines) + "\n"


def file_name(case):
    return "%s_seed%d_n%d.json" % (case[1], case[0], case[2])


def write_all(out):
    out.mkdir(parents=True, exist_ok=True)
    names = {file_name(c) for c in CASES}
    for stale in out.iterdir():
        if NAME.match(stale.name) and stale.name not in names:
            stale.unlink()
    for case in CASES:
        (out / file_name(case)).write_text(case_text(case))
    return sorted(names)


def check(committed):
    with tempfile.TemporaryDirectory() as tmp:
        names = write_all(pathlib.Path(tmp))
        present = {p.name for p in committed.glob("*.json")}
        missing, extra = sorted(set(names) - present), sorted(present - set(names))
        if missing or extra:
            sys.exit(f"make_adam_vectors.py: {committed} lacks {missing or 'nothing'} and has "
                     f"{extra or 'nothing'} beyond the cases")
        for name in names:
            # Numbers, not bytes: the "producer" field names the torch version, which a Debian
            # update changes without changing a single value.
            fresh = json.loads((pathlib.Path(tmp) / name).read_text())
            kept = json.loads((committed / name).read_text())
            fresh.pop("producer", None)
            kept.pop("producer", None)
            if fresh != kept:
                sys.exit(f"make_adam_vectors.py: {committed / name} differs from a fresh run "
                         f"(torch {torch.__version__}); regenerate with "
                         "/usr/bin/python3 scripts/make_adam_vectors.py")
    print(f"make_adam_vectors.py: {len(names)} files in {committed} match a fresh run")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                       help="folder to write (default: tests/testdata/adam)")
    group.add_argument("--check", type=pathlib.Path, metavar="DIR",
                       help="regenerate into a temp folder and compare with DIR's files")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.check is not None:
        check(args.check)
    else:
        names = write_all(args.out)
        print(f"make_adam_vectors.py: wrote {len(names)} files to {args.out}")


if __name__ == "__main__":
    main()
