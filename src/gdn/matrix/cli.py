"""`gdn-matrix`: the matrix's command line. Each subcommand registers its flags and a handler taking
the parsed arguments, so adding one touches only build_parser()."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from gdn import probe

# Exit status of `run` for a cell that could not run here (no device, no engine): distinct from a
# failure so that nox can record it as skipped.
EXIT_NOT_RUN = 3


def _run_cell(args: argparse.Namespace) -> int:
    from gdn.matrix.cell import run_cell
    from gdn.matrix.config import MatrixConfigError, load_matrix

    try:
        matrix = load_matrix(args.matrix)
        cell = matrix.cell(args.cell)
        outcome = run_cell(matrix, cell, args.root.resolve(), args.results.resolve(), runtime=args.runtime)
    except MatrixConfigError as exc:
        print(f"gdn-matrix run: {exc}", file=sys.stderr)
        return 2
    print(f"cell {cell.name}: {outcome.status}" + (f" ({outcome.reason})" if outcome.reason else ""))
    return {"passed": 0, "not_run": EXIT_NOT_RUN, "failed": 1}.get(outcome.status, 2)


def _add_run(commands) -> None:
    parser = commands.add_parser("run", help="run one matrix cell and write results/<cell>/")
    parser.add_argument("cell", help="cell name from matrix.yaml")
    parser.add_argument("--matrix", type=Path, default=None, help="matrix file (default: $GDN_MATRIX or matrix.yaml)")
    parser.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    parser.add_argument("--root", type=Path, default=Path(), help="the source checkout (default: .)")
    parser.add_argument(
        "--runtime",
        metavar="{docker,host}",
        help="run in this runtime instead of the cell's own; host: this Python environment, on a machine "
        "with the cell's device (its pins are then compared with what is installed)",
    )
    parser.set_defaults(handler=_run_cell)


def _add_module_command(commands, name: str, help_text: str) -> None:
    """Subcommands whose module provides add_arguments(parser) and run(args) (gdn.matrix.<name>)."""
    module = importlib.import_module(f"gdn.matrix.{name}")
    parser = commands.add_parser(name, help=help_text, description=module.__doc__.splitlines()[0])
    module.add_arguments(parser)
    parser.set_defaults(handler=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-matrix", description="Gated DeltaNet wheel-compatibility matrix.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    probe_parser = commands.add_parser(
        "probe",
        help="print this environment's manifest and gdn's backend resolution",
        description="The same as `python -m gdn.probe`.",
    )
    probe.add_arguments(probe_parser)
    probe_parser.set_defaults(handler=probe.run)
    _add_run(commands)
    _add_module_command(commands, "report", "build report.json / report.md / report.html from results/")
    _add_module_command(commands, "diff", "compare two report.json files; non-zero exit on a regression")
    _add_module_command(commands, "lock", "write each cell's lock file, or --check pins and locks")
    _add_module_command(commands, "pull", "fetch the latest matrix report from GitHub Actions (needs gh)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
