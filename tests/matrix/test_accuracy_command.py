"""`gdn-matrix accuracy`: --json prints and --output writes what the schema describes, --kernels adds the
table's calls to a kernels.json, and an unknown backend is refused by name."""

from __future__ import annotations

import json

import pytest

from gdn.matrix import accuracy
from gdn.matrix.schema import AccuracyFile, load

pytestmark = pytest.mark.tooling


def test_the_command_writes_what_the_schema_describes(tmp_path, capsys, monkeypatch):
    # without the interpreter, eager is the one backend of a CPU (a test module of this worker may have
    # turned the interpreter on)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "accuracy.json"
    kernels = tmp_path / "kernels.json"
    assert (
        accuracy.main(["--ops", "causal_conv1d_update", "--json", "--output", str(out), "--kernels", str(kernels)]) == 0
    )
    printed = json.loads(capsys.readouterr().out)
    found = load(AccuracyFile, out.read_bytes(), "accuracy.json")
    assert printed == json.loads(out.read_text())
    assert found.device == "cpu" and {r.backend for r in found.rows} == {"eager"}
    assert json.loads(kernels.read_text())["steps"]["accuracy"]


def test_an_unknown_backend_is_refused_by_name(capsys):
    assert accuracy.main(["--backends", "nosuch"]) == 2
    assert "argument --backends: unknown ['nosuch']" in capsys.readouterr().err
