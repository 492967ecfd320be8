"""`gdn-matrix`: the matrix's command line. Each subcommand registers its flags and a handler taking
the parsed arguments, so adding one (run, report, diff, pull) touches only build_parser()."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gdn import probe


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
