"""A matrix module run on its own (`python -m gdn.matrix.<name>`): the module gives its flags
(`add_arguments`) and its handler (`run`), the same two it gives its `gdn-matrix` subcommand, and a
Program builds the parser and the `main` around them, so the two ways in parse alike."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Program:
    prog: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    epilog: str | None = None
    # argparse.RawDescriptionHelpFormatter where the epilog is laid out by hand (a table of exit codes)
    formatter_class: type[argparse.HelpFormatter] = argparse.HelpFormatter

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(
            prog=self.prog, description=self.description, epilog=self.epilog, formatter_class=self.formatter_class
        )
        self.add_arguments(parser)
        return parser

    def main(self, argv: Sequence[str] | None = None) -> int:
        return self.run(self.parser().parse_args(argv))
