"""Measure how far off every backend's kernels are, against fp64 references, and write accuracy.json.

Each backend that serves an op on this device runs each of the op's cases (bf16 and fp32 inputs; a mild
and Qwen3.5's gate regime; a dense and a packed layout; grouped value heads) and every output and
gradient is compared with an fp64 token recurrence or tap-by-tap conv written for the table
(gdn.matrix.accuracy.reference) by ||out - ref|| / ||ref||. The chunk op runs forward and backward with
an initial state and a loss on the output and the final state (o, final_state, dq, dk, dv, dg, dbeta,
dh0); the recurrent and pool-decode ops compare o and the state; the conv ops their output and state.
What each row's calls ran, down to a peer's own dispatch (fla's registry), is recorded with the row and,
with --kernels, as the "accuracy" step of a cell's kernels.json.

    gdn-matrix accuracy [--json] [--output accuracy.json] [--backends eager triton] [--ops OP ...]
    python -m gdn.matrix.accuracy ...   (the same, inside a cell)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from gdn.matrix.devices import visible_accelerator
from gdn.matrix.program import Program

FILE = "accuracy.json"  # in a cell's results directory
EXIT_CODES = "exit status: 0 the table was measured (its rows say how accurate), 2 unusable arguments"
BUDGET_S = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gdn.matrix.accuracy.cases import DTYPES, OPS

    parser.add_argument("--device", help="torch device type to measure on (default: the accelerator, else cpu)")
    parser.add_argument("--backends", nargs="+", metavar="NAME", help="only these backends (default: every one)")
    parser.add_argument("--ops", nargs="+", choices=OPS, metavar="OP", help=f"only these ops, of {', '.join(OPS)}")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), metavar="DTYPE", help="only these input dtypes")
    parser.add_argument("--output", type=Path, metavar="PATH", help="write accuracy.json here")
    parser.add_argument("--kernels", type=Path, metavar="PATH", help="add the table's calls to this kernels.json")
    parser.add_argument("--json", action="store_true", help="print accuracy.json instead of the table")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=BUDGET_S,
        metavar="SECONDS",
        help=f"after this long, the rows not yet measured say so (default {BUDGET_S:g})",
    )


def _device(requested: str | None):
    import torch

    if requested:
        return torch.device(requested)
    return torch.device(visible_accelerator() or "cpu")


def run(args: argparse.Namespace) -> int:
    import torch

    from gdn.matrix.accuracy import measure, table
    from gdn.matrix.accuracy.cases import OPS, size_for
    from gdn.matrix.jsonio import write_json
    from gdn.matrix.kernels import add_step, recording
    from gdn.matrix.schema import AccuracyFile
    from gdn.resolve import backends

    device = _device(args.device)
    known = backends()
    unknown = sorted(set(args.backends or ()) - set(known))
    if unknown:
        expected = f"expected from {sorted(known)}"
        print(f"gdn-matrix accuracy: argument --backends: unknown {unknown}, {expected}", file=sys.stderr)
        return 2
    chosen = {name: b for name, b in known.items() if not args.backends or name in args.backends}
    size = size_for(device)
    echo = None if args.json else (lambda row: print(table.lines([row])[1], flush=True))
    if echo is not None:
        print(table.lines([])[0], flush=True)
    started = time.monotonic()
    with recording() as log:
        rows = measure.measure(device, chosen, size, tuple(args.ops or OPS), args.budget_s, echo, args.dtypes)
    found = AccuracyFile(
        device=device.type,
        shape=size.describe(),
        rows=rows,
        unavailable=measure.unavailable(chosen, device.type),
        environment={"torch": torch.__version__, "date": time.strftime("%Y-%m-%d")},
        elapsed_s=round(time.monotonic() - started, 2),
        budget_s=args.budget_s,
    )
    if args.kernels is not None:
        add_step(args.kernels, "accuracy", log.mark())
    if args.output is not None:
        write_json(args.output, asdict(found))
    if args.json:
        print(json.dumps(asdict(found), indent=2))
    else:
        for name, reason in found.unavailable.items():
            print(f"{name}: not measured here: {reason}")
    return 0


PROGRAM = Program("gdn-matrix accuracy", __doc__.splitlines()[0], add_arguments, run, EXIT_CODES)
main = PROGRAM.main
