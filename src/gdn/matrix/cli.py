"""`gdn-matrix`: the matrix's command line. Each subcommand registers its flags and a handler taking
the parsed arguments, so adding one touches only build_parser()."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import gdn
from gdn.matrix import probe

# Exit status of `run` for a cell that could not run here (no device, no engine) when a run is
# required (--require-run, or GDN_REQUIRE_RUN=1 as the nox sessions read it): distinct from a failure.
# Otherwise such a cell is recorded as not run and the command exits 0, as its nox session is skipped.
EXIT_NOT_RUN = 3
REQUIRE_RUN_ENV = "GDN_REQUIRE_RUN"
HELP_WIDTH = 100
RUN_EXIT_CODES = f"""exit status:
  0  the cell passed, or could not run here (recorded as not run) and no run was required
  1  its tests failed
  2  the cell broke (probe crash, build failure, timeout, ...) or the input is unusable
  {EXIT_NOT_RUN}  it could not run here and --require-run (or {REQUIRE_RUN_ENV}=1) asked for a run
  128+N  interrupted by signal N"""


def _run_cell(args: argparse.Namespace) -> int:
    from gdn.matrix.cell import CellInterruptedError, run_cell
    from gdn.matrix.config import MatrixConfigError, load_matrix
    from gdn.matrix.runs import CellBusyError

    try:
        matrix = load_matrix(args.matrix)
        cell = matrix.cell(args.cell)
        outcome = run_cell(
            matrix, cell, args.root.resolve(), args.results.resolve(), runtime=args.runtime, wait_s=args.wait
        )
    except (MatrixConfigError, CellBusyError) as exc:
        print(f"gdn-matrix run: {exc}", file=sys.stderr)
        return 2
    except CellInterruptedError as exc:
        print(f"gdn-matrix run: cell {args.cell} {exc}; recorded in its interrupted.json", file=sys.stderr)
        return 128 + exc.signum
    print(f"cell {cell.name}: {outcome.status}" + (f" ({outcome.reason})" if outcome.reason else ""))
    # a flaky cell's tests failed: its run fails as a failed one does, and the report says flaky
    exits = {"passed": 0, "not_run": EXIT_NOT_RUN if args.require_run else 0, "failed": 1, "flaky": 1}
    return exits.get(outcome.status, 2)


def _add_run(commands) -> None:
    parser = commands.add_parser(
        "run",
        help="run one matrix cell and write results/<cell>/",
        description="Run one matrix cell (its probe, test families and benchmark) in its runtime and write "
        "results/<cell>/; a cell that cannot run here is recorded as not run, with the reason.",
        epilog=RUN_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    parser.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        help="while another run of the cell is in progress, wait at most this long, then exit 2 "
        "(default: wait until it ends; 0: refuse at once)",
    )
    parser.add_argument(
        "--require-run",
        action="store_true",
        default=os.environ.get(REQUIRE_RUN_ENV) == "1",
        help=f"exit {EXIT_NOT_RUN} when the cell cannot run here instead of 0 (default: on when {REQUIRE_RUN_ENV}=1)",
    )
    parser.set_defaults(handler=_run_cell)


def _write_schemas(args: argparse.Namespace) -> int:
    from gdn.matrix import schema

    names = [args.name] if args.name else list(schema.MODELS)
    if args.output is None:
        for name in names:
            print(schema.schema_text(name), end="")
        return 0
    args.output.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = args.output / f"{name}.schema.json"
        path.write_text(schema.schema_text(name))
        print(path)
    return 0


def _add_schema(commands) -> None:
    from gdn.matrix.schema import MODELS

    parser = commands.add_parser(
        "schema",
        help="print or write the JSON Schemas of the matrix's files (cell.json, manifest.json, ...)",
        description="The JSON Schemas of the files the matrix's stages pass on (gdn.matrix.schema).",
    )
    parser.add_argument("name", nargs="?", choices=list(MODELS), help="one schema (default: all)")
    parser.add_argument("--output", type=Path, metavar="DIR", help="write NAME.schema.json files to DIR")
    parser.set_defaults(handler=_write_schemas)


def first_paragraph(text: str) -> str:
    """A docstring's first paragraph on one line: the whole of its first sentences, for --help."""
    return textwrap.fill(" ".join(text.strip().split("\n\n")[0].split()), width=HELP_WIDTH)


def _add_module_command(commands, name: str, help_text: str) -> None:
    """Subcommands whose module provides add_arguments(parser) and run(args) (gdn.matrix.<name>)."""
    module = importlib.import_module(f"gdn.matrix.{name}")
    parser = commands.add_parser(
        name,
        help=help_text,
        description=first_paragraph(module.__doc__),
        # a module's EXIT_CODES text goes under its --help, where a CI author looks for it
        epilog=getattr(module, "EXIT_CODES", None),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    parser.set_defaults(handler=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-matrix", description="Gated DeltaNet wheel-compatibility matrix.")
    parser.add_argument("--version", action="version", version=f"gdn-matrix {gdn.__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show the debug logs of gdn and the libraries it drives (docker)"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    manifest_parser = commands.add_parser(
        "manifest",
        help="print this environment's manifest and gdn's backend resolution",
        description="The same as `python -m gdn.manifest`.",
    )
    probe.add_arguments(manifest_parser)
    manifest_parser.set_defaults(handler=probe.run)
    _add_run(commands)
    _add_schema(commands)
    _add_module_command(commands, "report", "build report.json / report.md / report.html from results/")
    _add_module_command(commands, "diff", "compare two report.json files; non-zero exit on a regression")
    _add_module_command(commands, "lock", "write each cell's lock file, or --check pins and locks")
    _add_module_command(commands, "accuracy", "measure every backend's error against fp64 references (accuracy.json)")
    _add_module_command(commands, "pull", "fetch the latest matrix report from GitHub Actions (needs gh)")
    _add_module_command(
        commands, "history", "keep reports in a history directory (add) and render it as a site (render)"
    )
    _add_module_command(commands, "check", "is my upgrade safe? this stack's cell (and --to's) in the reports")
    _add_module_command(commands, "bisect", "name the package between two locks that flips a cell's failing tests")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(name)s: %(message)s")
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
