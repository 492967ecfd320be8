"""`gdn-matrix pull` against a fake `gh` on PATH: the latest successful run's report artifact lands in
the destination; no gh, gh logged out, no successful run, a missing artifact and an artifact without
report.json each end with a clear message and the documented exit status."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gdn.matrix import pull

pytestmark = pytest.mark.tooling

# Emulates the gh calls pull makes; FAKE_GH_* variables choose the answers, and every call is logged.
FAKE_GH = """#!{python}
import json, os, shutil, sys
args = sys.argv[1:]
with open(os.environ["FAKE_GH_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if args[:2] == ["auth", "status"]:
    if os.environ.get("FAKE_GH_AUTH") == "fail":
        sys.exit("You are not logged into any GitHub hosts. To log in, run: gh auth login")
    print("Logged in to github.com account someone")
elif args[:2] == ["run", "list"]:
    print(os.environ["FAKE_GH_RUNS"])
elif args[:2] == ["run", "download"]:
    name, dest = args[args.index("-n") + 1], args[args.index("-D") + 1]
    if name != os.environ["FAKE_GH_ARTIFACT_NAME"]:
        sys.exit("no artifact matches any of the names or patterns provided")
    shutil.copytree(os.environ["FAKE_GH_ARTIFACT_DIR"], dest, dirs_exist_ok=True)
else:
    sys.exit("fake gh: unexpected call " + " ".join(args))
"""

RUN = {
    "databaseId": 4242,
    "url": "https://github.invalid/o/n/actions/runs/4242",
    "createdAt": "2026-11-28T10:00:00Z",
    "headSha": "abc123",
}


@pytest.fixture
def fake_gh(tmp_path, monkeypatch) -> Path:
    """A gh on an otherwise empty PATH; returns the call log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    gh.write_text(FAKE_GH.format(python=sys.executable))
    gh.chmod(0o755)
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "report.json").write_text('{"schema": 1, "cells": []}\n')
    (artifact / "report.md").write_text("# gdn-matrix report\n")
    log = tmp_path / "gh.log"
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_GH_LOG", str(log))
    monkeypatch.setenv("FAKE_GH_RUNS", json.dumps([RUN]))
    monkeypatch.setenv("FAKE_GH_ARTIFACT_NAME", "matrix-report")
    monkeypatch.setenv("FAKE_GH_ARTIFACT_DIR", str(artifact))
    return log


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_pulls_the_latest_successful_report(fake_gh, tmp_path, capsys):
    dest = tmp_path / "pulled"
    dest.mkdir()
    (dest / "report.json").write_text("stale")
    (dest / "notes.txt").write_text("mine")
    assert pull.main(["--repo", "o/n", "--dest", str(dest)]) == 0

    assert json.loads((dest / "report.json").read_text()) == {"schema": 1, "cells": []}
    assert (dest / "report.md").read_text() == "# gdn-matrix report\n"
    assert (dest / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".pulled")) == []
    out = capsys.readouterr().out
    assert out == f"pulled matrix-report from {RUN['url']} (2026-11-28T10:00:00Z, abc123)\n{dest / 'report.json'}\n"

    auth, listing, download = _calls(fake_gh)
    assert auth == ["auth", "status"]
    assert listing == [
        "run",
        "list",
        "--workflow",
        "matrix.yml",
        "--branch",
        "main",
        "--status",
        "success",
        "--limit",
        "1",
        "--json",
        "databaseId,url,createdAt,headSha",
        "--repo",
        "o/n",
    ]
    assert download[:5] == ["run", "download", "4242", "-n", "matrix-report"]
    assert download[-2:] == ["--repo", "o/n"]


def test_options_reach_gh_and_no_repo_means_the_checkouts(fake_gh, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_GH_ARTIFACT_NAME", "nightly-report")
    args = ["--branch", "release", "--workflow", "nightly.yml", "--artifact", "nightly-report"]
    assert pull.main([*args, "--dest", str(tmp_path / "d")]) == 0
    _, listing, download = _calls(fake_gh)
    assert listing[2:6] == ["--workflow", "nightly.yml", "--branch", "release"]
    assert "--repo" not in listing + download
    assert download[3:5] == ["-n", "nightly-report"]


def test_without_gh_on_path(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert pull.main(["--dest", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gdn-matrix pull needs the GitHub CLI (gh)")
    assert "gh auth login" in err
    assert not (tmp_path / "d").exists()


def test_gh_not_logged_in(fake_gh, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_GH_AUTH", "fail")
    assert pull.main(["--dest", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gdn-matrix pull: gh is not logged in to GitHub. Run `gh auth login`")
    assert "gh says: You are not logged into any GitHub hosts." in err
    assert _calls(fake_gh) == [["auth", "status"]]


def test_no_successful_run(fake_gh, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_GH_RUNS", "[]")
    assert pull.main(["--dest", str(tmp_path / "d")]) == 1
    assert capsys.readouterr().err == "gdn-matrix pull: no successful run of workflow matrix.yml on branch main\n"
    assert [call[:2] for call in _calls(fake_gh)] == [["auth", "status"], ["run", "list"]]


@pytest.mark.parametrize("missing", ["artifact", "report.json"])
def test_nothing_usable_in_the_run_leaves_dest_alone(fake_gh, tmp_path, monkeypatch, capsys, missing):
    if missing == "artifact":
        monkeypatch.setenv("FAKE_GH_ARTIFACT_NAME", "something-else")
        message = "gdn-matrix pull: `gh run download 4242 -n matrix-report -D "
    else:
        (tmp_path / "artifact" / "report.json").unlink()
        message = "gdn-matrix pull: artifact matrix-report of run 4242 has no report.json"
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "report.json").write_text("previous")
    assert pull.main(["--dest", str(dest)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(message)
    if missing == "artifact":
        assert "no artifact matches any of the names or patterns provided" in err
    assert [p.name for p in dest.iterdir()] == ["report.json"]
    assert (dest / "report.json").read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".d.pull-")] == []
