"""The `gdn-matrix` command line as users and CI scripts call it: every command, and each command's
arguments (how each is given: a flag, a value, a repeated value, a positional), read from the argparse
parser itself, so a restructuring that drops or reshapes one fails here instead of in someone's CI."""

from __future__ import annotations

import argparse

import pytest

from gdn.matrix import accuracy, bisect, cli, diff, lock, probe, pull

pytestmark = pytest.mark.tooling

# option strings (or a positional's name) -> how it is given, with its nargs where it has one
TOP = {"--version": "version", "-v/--verbose": "flag"}
COMMANDS = {
    "manifest": {"--json": "flag", "--mode": "value", "--output": "value"},
    "run": {
        "cell": "positional",
        "--matrix": "value",
        "--results": "value",
        "--root": "value",
        "--runtime": "value",
        "--wait": "value",
        "--require-run": "flag",
    },
    "schema": {"name": "positional ?", "--output": "value"},
    "report": {"--results": "value", "--matrix": "value", "--output": "value"},
    "diff": {
        "old": "positional",
        "new": "positional",
        "--threshold": "value",
        "--route-changes-regress": "flag",
        "--skip-not-run": "flag",
        "--pair": "append",
        "--accuracy-factor": "value",
        "--gate-flaky": "flag",
        "--history": "value",
        "--no-fail": "flag",
        "--output": "value",
    },
    "lock": {
        "cells": "positional *",
        "--check": "flag",
        "--matrix": "value",
        "--root": "value",
        "--find-links": "append",
        "--no-index": "flag",
    },
    "accuracy": {
        "--device": "value",
        "--backends": "value +",
        "--ops": "value +",
        "--dtypes": "value +",
        "--output": "value",
        "--kernels": "value",
        "--json": "flag",
        "--budget-s": "value",
    },
    "pull": {"--repo": "value", "--branch": "value", "--workflow": "value", "--artifact": "value", "--dest": "value"},
    "history": {},
    "check": {"--report": "value", "--history": "value", "--to": "append", "--matrix": "value", "--json": "flag"},
    "bisect": {
        "cell": "positional",
        "--good": "value",
        "--bad": "value",
        "--test": "append",
        "--work": "value",
        "--matrix": "value",
        "--root": "value",
    },
}
# commands with verbs of their own: each verb's arguments
VERBS = {
    "history": {
        "add": {
            "report_dir": "positional",
            "--results": "value",
            "--history": "value",
            "--keep": "value",
            "--max-mb": "value",
        },
        "render": {"--history": "value", "--out": "value"},
    },
}


def _how(action: argparse.Action) -> str:
    if isinstance(action, argparse._VersionAction):
        return "version"
    if isinstance(action, argparse._StoreTrueAction):
        return "flag"
    kind = "append" if isinstance(action, argparse._AppendAction) else "value"
    if not action.option_strings:
        kind = "positional"
    return f"{kind} {action.nargs}" if action.nargs is not None else kind


def arguments(parser: argparse.ArgumentParser) -> dict[str, str]:
    return {
        "/".join(a.option_strings) or a.dest: _how(a)
        for a in parser._actions
        if not isinstance(a, (argparse._SubParsersAction, argparse._HelpAction))
    }


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_commands_are_the_documented_ones():
    parser = cli.build_parser()
    assert arguments(parser) == TOP
    assert list(_subcommands(parser)) == list(COMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_commands_arguments_are_kept(command):
    assert arguments(_subcommands(cli.build_parser())[command]) == COMMANDS[command]


@pytest.mark.parametrize("command", list(VERBS))
def test_each_verbs_arguments_are_kept(command):
    verbs = _subcommands(_subcommands(cli.build_parser())[command])
    assert {verb: arguments(parser) for verb, parser in verbs.items()} == VERBS[command]


@pytest.mark.parametrize("module", [diff, pull], ids=["diff", "pull"])
def test_the_python_m_entry_points_take_what_their_command_takes(module):
    """`python -m gdn.matrix.diff` and `python -m gdn.matrix.pull`, which the README names, parse as
    their `gdn-matrix` command does."""
    command = module.__name__.rsplit(".", 1)[1]
    assert arguments(module.PROGRAM.parser()) == COMMANDS[command]


@pytest.mark.parametrize(
    ("module", "command"),
    [(probe, "manifest"), (accuracy, "accuracy"), (lock, "lock"), (bisect, "bisect")],
    ids=["probe", "accuracy", "lock", "bisect"],
)
def test_the_other_python_m_programs_take_what_their_command_takes(module, command):
    """The matrix's other modules that run on their own parse as the `gdn-matrix` command that runs
    the same handler."""
    assert arguments(module.PROGRAM.parser()) == COMMANDS[command]
