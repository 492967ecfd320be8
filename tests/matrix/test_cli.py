"""The `gdn-matrix` command itself: its version, whole help sentences, and quiet by default."""

from __future__ import annotations

import argparse
import logging

import pytest

import gdn
from gdn.matrix.cli import build_parser, main

pytestmark = pytest.mark.tooling


def test_version_names_the_package_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"gdn-matrix {gdn.__version__}\n"


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", ["report", "diff", "lock", "pull", "run", "schema", "manifest"])
def test_each_subcommands_help_describes_it_in_whole_sentences(name):
    description = _subcommands()[name].description
    assert description and description.rstrip().endswith((".", ")")), description
    assert description[0].isupper() or description.startswith("`"), description


def test_debug_logs_of_the_libraries_show_only_with_verbose(monkeypatch, capsys):
    """docker-py logs every API call at DEBUG: shown with -v, never by default."""
    configured = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: configured.append(kwargs["level"]))
    assert main(["schema", "cell"]) == 0
    assert configured == []
    assert main(["-v", "schema", "cell"]) == 0
    assert configured == [logging.DEBUG]
