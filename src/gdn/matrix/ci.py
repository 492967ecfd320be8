"""The GitHub Actions job matrix, generated from matrix.yaml (the workflow holds no second copy of the
cell list). A cell goes to the hosted job only when its runner labels can mean nothing but one of
GitHub's own machines: a single label from GitHub's list of standard hosted runners. Every other cell
goes to the self-hosted job, which never runs for pull requests from forks.

    python -m gdn.matrix.ci [--matrix matrix.yaml] [--cells a,b] [--github-output $GITHUB_OUTPUT]

prints, and appends to the GitHub output file, `hosted` / `self_hosted` (JSON for `fromJSON`, shaped
{"include": [...]}) and their counts, so each job can be skipped when its matrix is empty (Actions
rejects an empty matrix).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from gdn.matrix.config import Cell, Matrix, MatrixConfigError, load_matrix
from gdn.matrix.devices import github_hosted
from gdn.matrix.program import Program


def job_entry(cell: Cell) -> dict:
    return {
        "cell": cell.name,
        "device": cell.device,
        "runtime": cell.runtime,
        "runs_on": list(cell.runner_labels),
        # a base image made on the runner (debootstrap), not pulled from a registry
        "local_base": bool(cell.base_image and cell.base_image.endswith(":local")),
        "torch": cell.versions.torch or "",
        "timeout_minutes": -(-cell.timeout_s // 60) + 30,  # the cell's own limit plus image build time
    }


def select(matrix: Matrix, names: Sequence[str]) -> list[Cell]:
    """The cells to run: all with runner labels, or the named ones (each must exist and have labels)."""
    if not names:
        return [c for c in matrix.cells if c.runner_labels]
    cells = [matrix.cell(name) for name in names]
    unlabelled = [c.name for c in cells if not c.runner_labels]
    if unlabelled:
        raise MatrixConfigError(f"cells {unlabelled}: key 'runner_labels': empty, so no CI runner can take them")
    return cells


def job_matrices(matrix: Matrix, names: Sequence[str] = ()) -> dict[str, dict]:
    cells = select(matrix, names)
    return {
        "hosted": {"include": [job_entry(c) for c in cells if github_hosted(c.runner_labels)]},
        "self_hosted": {"include": [job_entry(c) for c in cells if not github_hosted(c.runner_labels)]},
    }


def github_outputs(matrices: dict[str, dict]) -> dict[str, str]:
    outputs = {}
    for key, value in matrices.items():
        outputs[key] = json.dumps(value, separators=(",", ":"))
        outputs[f"{key}_count"] = str(len(value["include"]))
    return outputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", type=Path, default=None)
    parser.add_argument("--cells", default="", help="comma-separated cell names (default: every labelled cell)")
    parser.add_argument("--github-output", type=Path, default=None, help="append name=value lines here")


def run(args: argparse.Namespace) -> int:
    try:
        names = [n.strip() for n in args.cells.split(",") if n.strip()]
        outputs = github_outputs(job_matrices(load_matrix(args.matrix), names))
    except MatrixConfigError as exc:
        print(f"gdn.matrix.ci: {exc}", file=sys.stderr)
        return 2
    lines = [f"{key}={value}" for key, value in outputs.items()]
    print("\n".join(lines))
    if args.github_output:
        with args.github_output.open("a") as handle:
            handle.write("\n".join(lines) + "\n")
    return 0


PROGRAM = Program("python -m gdn.matrix.ci", __doc__.splitlines()[0], add_arguments, run)
main = PROGRAM.main


if __name__ == "__main__":
    sys.exit(main())
