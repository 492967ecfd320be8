"""The matrix workflow's `history` job: it runs on the default branch's own runs alone (never a pull
request, a fork's or not, never another branch or another repository), it is the only job that writes
and writes the repository's contents alone, and its script, run here against a local bare repository,
keeps each report on the `history` branch as one commit holding the entries and the rendered site."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from actions_expr import evaluate
from repo_paths import ROOT, TESTS

pytestmark = pytest.mark.tooling

WORKFLOW = ROOT / ".github" / "workflows" / "matrix.yml"
REPOSITORY = "gdn-org/gdn-matrix"


def jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]


def context(
    event: str,
    *,
    ref: str = "refs/heads/main",
    repository: str = REPOSITORY,
    variable: str | None = REPOSITORY,
    report: str = "success",
    status: str = "success",
    head_repo: str | None = None,
) -> dict:
    github = {"event_name": event, "ref": ref, "repository": repository}
    if head_repo is not None:
        github["event"] = {"pull_request": {"head": {"repo": {"full_name": head_repo}}}}
    variables = {"MATRIX_HISTORY_REPOSITORY": variable} if variable is not None else {}
    return {"github": github, "vars": variables, "needs": {"report": {"result": report}}, "status": status}


@pytest.mark.parametrize(
    ("ctx", "publishes"),
    [
        (context("schedule"), True),
        (context("workflow_dispatch"), True),
        (context("push"), True),
        (context("schedule", status="failure"), True),  # a failing cell is history too
        (context("pull_request", ref="refs/pull/7/merge", head_repo="someone/gdn-matrix"), False),
        (context("pull_request", ref="refs/pull/7/merge", head_repo=REPOSITORY), False),
        (context("pull_request", head_repo="someone/gdn-matrix"), False),  # even where the ref reads main
        (context("pull_request_target"), False),
        (context("workflow_run"), False),
        (context("push", ref="refs/heads/feature"), False),
        (context("workflow_dispatch", ref="refs/heads/feature"), False),
        (context("push", ref="refs/tags/main"), False),
        (context("schedule", repository="someone/gdn-matrix", variable=None), False),  # a fork
        (context("push", repository="someone/gdn-matrix"), False),  # a fork that copied the variable
        (context("schedule", variable=None), False),
        (context("schedule", report="failure"), False),
        (context("schedule", report="skipped"), False),
        (context("schedule", status="cancelled"), False),
    ],
    ids=[
        "schedule",
        "dispatch",
        "push-main",
        "after-a-failed-cell",
        "fork-pr",
        "same-repo-pr",
        "pr-with-main-ref",
        "pr-target",
        "workflow-run",
        "push-branch",
        "dispatch-branch",
        "tag-named-main",
        "fork-schedule",
        "fork-with-variable",
        "variable-unset",
        "report-failed",
        "report-skipped",
        "cancelled",
    ],
)
def test_the_history_job_runs_on_the_default_branchs_own_runs_only(ctx, publishes):
    assert bool(evaluate(jobs()["history"]["if"], ctx)) is publishes


def test_the_history_job_alone_writes_and_only_the_repositorys_contents():
    workflow = jobs()
    assert workflow["history"]["permissions"] == {"contents": "write"}
    assert workflow["history"]["needs"] == "report"
    for name, job in workflow.items():
        if name != "history":
            assert "write" not in job["permissions"].values(), name


def test_only_the_publishing_step_is_given_the_token_and_no_checkout_keeps_it():
    steps = jobs()["history"]["steps"]
    holding = [s for s in steps if "github.token" in str(s.get("env", {})) or "secrets." in str(s)]
    assert [s["name"] for s in holding] == ["Add the report to the history branch and render its site"]
    assert all(
        s["with"]["persist-credentials"] is False for s in steps if s.get("uses", "").startswith("actions/checkout@")
    )


def publish_script() -> str:
    step = next(s for s in jobs()["history"]["steps"] if s.get("name", "").startswith("Add the report"))
    return step["run"]


# The publishing script runs git, as the runners have it; a machine with Python alone may not.
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git on PATH: the publishing script runs it")


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def publish(workspace: Path, remote: Path, version: str, script: str | None = None) -> subprocess.CompletedProcess:
    """The step's script as the workflow has it, in a workspace laid out as the job leaves it (the
    checkout's src/, results/report and the cells' results), pushing to a local bare repository."""
    if workspace.exists():
        shutil.rmtree(workspace)
    shutil.copytree(TESTS / "data" / "history" / f"triton-{version}", workspace / "results")
    (workspace / "src").symlink_to(ROOT / "src")
    git("init", "-q", cwd=workspace)
    env = {
        **os.environ,
        "GH_TOKEN": "not-a-token",
        "REMOTE": remote.as_uri(),
        "BRANCH": "history",
        "GITHUB_SHA": f"sha-of-{version}",
    }
    env.pop("PYTHONPATH", None)
    script = publish_script() if script is None else script
    return subprocess.run(["bash", "-c", script], cwd=workspace, env=env, capture_output=True, text=True)


@needs_git
def test_the_publishing_script_keeps_each_report_as_one_commit_with_the_site(tmp_path):
    remote = tmp_path / "remote.git"
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    for version in ("3.2.0", "3.6.0"):
        done = publish(tmp_path / "workspace", remote, version)
        assert done.returncode == 0, done.stdout + done.stderr
    assert git("rev-list", "--count", "history", cwd=remote).strip() == "1"  # replaced, not appended
    files = git("ls-tree", "-r", "--name-only", "history", cwd=remote).splitlines()
    entries = sorted({f.split("/")[1] for f in files if f.startswith("history/") and f.endswith("/entry.json")})
    assert len(entries) == 2 and "index.html" in files and ".nojekyll" in files
    assert any(f.endswith("/cells/local/manifest.json") for f in files)
    page = git("show", "history:index.html", cwd=remote)
    assert "3.2.0" in page and "3.6.0" in page
    assert (
        git("log", "-1", "--format=%s", "history", cwd=remote).strip() == "matrix history: the report of sha-of-3.6.0"
    )


@needs_git
def test_a_publish_that_finds_the_branch_moved_fails_and_loses_nothing(tmp_path):
    """The push carries a lease on the commit the script read: when the branch is not there to be read
    (ls-remote refused) but exists, the push is refused and the branch keeps what it had."""
    remote = tmp_path / "remote.git"
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    assert publish(tmp_path / "workspace", remote, "3.2.0").returncode == 0
    before = git("rev-parse", "history", cwd=remote)
    # ls-remote asked for another branch, as a failed ls-remote leaves it: the script reads no branch
    script = publish_script().replace('--heads "$REMOTE" "refs/heads/$BRANCH"', '--heads "$REMOTE" refs/heads/none')
    assert script != publish_script()
    done = publish(tmp_path / "workspace", remote, "3.6.0", script)
    assert done.returncode != 0 and "stale info" in done.stderr, done.stderr
    assert git("rev-parse", "history", cwd=remote) == before


@needs_git
def test_git_reads_the_token_as_githubs_basic_authorization_header(tmp_path):
    """The lines of the script that hand git the token, run: git's configuration then holds the header
    actions/checkout would have written (x-access-token and the token, in base64)."""
    script = publish_script()
    setup = script[: script.index("export GIT_CONFIG_VALUE_0") + len("export GIT_CONFIG_VALUE_0")]
    env = {**os.environ, "GH_TOKEN": "ghs_example"}
    done = subprocess.run(
        ["bash", "-c", setup + "\ngit config --get http.extraheader"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    expected = "AUTHORIZATION: basic " + base64.b64encode(b"x-access-token:ghs_example").decode()
    assert done.returncode == 0 and done.stdout.strip() == expected, done.stderr
