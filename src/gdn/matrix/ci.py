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

# The labels of GitHub's standard hosted runners (docs.github.com: "GitHub-hosted runners reference").
# GitHub routes by label and a self-hosted runner needs no `self-hosted` label in `runs-on`, so any
# label not on this list may reach a runner of ours: such cells must go to the guarded job. Only labels
# GitHub documents belong here; a hosted label missing from the list merely sends its cell to the
# guarded job, while a custom label on it would open our runners to forks. Retired labels
# (ubuntu-20.04, windows-2019, macos-13) are left out: no hosted runner answers to them any more, so
# only a runner of ours could take such a job.
GITHUB_HOSTED_LABELS = frozenset(
    {
        "ubuntu-latest",
        "ubuntu-24.04",
        "ubuntu-22.04",
        "ubuntu-slim",
        "ubuntu-24.04-arm",
        "ubuntu-22.04-arm",
        "windows-latest",
        "windows-2025",
        "windows-2022",
        "windows-11-arm",
        "macos-latest",
        "macos-26",
        "macos-15",
        "macos-26-intel",
        "macos-15-intel",
    }
)


def github_hosted(labels: Sequence[str]) -> bool:
    """Whether `runs-on: labels` can only be one of GitHub's hosted runners. Labels match without
    regard to case; several labels ask for a runner that has them all, which no hosted runner does."""
    names = {label.lower() for label in labels}
    return len(names) == 1 and names <= GITHUB_HOSTED_LABELS


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gdn.matrix.ci", description=__doc__.splitlines()[0])
    parser.add_argument("--matrix", type=Path, default=None)
    parser.add_argument("--cells", default="", help="comma-separated cell names (default: every labelled cell)")
    parser.add_argument("--github-output", type=Path, default=None, help="append name=value lines here")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
