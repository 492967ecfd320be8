"""The GitHub Actions workflows: schema-valid, yamllint- and zizmor-clean, least privilege, pinned
actions, a job matrix generated from matrix.yaml, and a fork guard on every self-hosted job."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from actions_expr import evaluate
from gdn.matrix.ci import job_matrices
from gdn.matrix.ci import main as ci_main
from gdn.matrix.config import MatrixConfigError, load_matrix

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
MATRIX = load_matrix(ROOT / "matrix.yaml")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail(f"{name} is not installed (it is in the test extra)")
    return found


def test_workflows_exist():
    assert {p.name for p in WORKFLOWS} == {"ci.yml", "matrix.yml"}


def test_workflows_match_the_github_schema():
    result = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint():
    result = subprocess.run(
        [tool("yamllint"), "--strict", *map(str, WORKFLOWS), str(ROOT / "matrix.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_finds_nothing_even_pedantic():
    result = subprocess.run(
        [tool("zizmor"), "--offline", "--persona", "pedantic", *map(str, WORKFLOWS)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings" in result.stdout + result.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_least_privilege_and_pinned_actions(path):
    workflow = load(path)
    assert workflow["permissions"] == {}, "workflow-level permissions must be empty; jobs ask for what they need"
    on = workflow[True] if True in workflow else workflow["on"]  # PyYAML reads the key `on` as True
    assert "pull_request_target" not in on
    for name, job in workflow["jobs"].items():
        assert "permissions" in job, f"job {name} must declare its permissions"
        assert set(job["permissions"].values()) <= {"read"}, f"job {name} writes: {job['permissions']}"
        for step in job.get("steps", []):
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), f"unpinned {step['uses']}"
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step.get("with", {}).get("persist-credentials") is False
    assert "concurrency" in workflow and workflow["concurrency"]["cancel-in-progress"] is True


def test_generator_yields_exactly_the_labelled_cells_with_their_labels(tmp_path):
    out = tmp_path / "github_output"
    assert ci_main(["--matrix", str(ROOT / "matrix.yaml"), "--github-output", str(out)]) == 0
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    hosted, self_hosted = json.loads(outputs["hosted"])["include"], json.loads(outputs["self_hosted"])["include"]
    by_name = {e["cell"]: e for e in hosted + self_hosted}
    labelled = {c.name: c for c in MATRIX.cells if c.runner_labels}
    assert set(by_name) == set(labelled) and len(by_name) == len(hosted) + len(self_hosted)
    for name, cell in labelled.items():
        assert by_name[name]["runs_on"] == list(cell.runner_labels)
        assert (by_name[name] in self_hosted) == ("self-hosted" in cell.runner_labels)
    assert outputs["hosted_count"] == str(len(hosted)) and outputs["self_hosted_count"] == str(len(self_hosted))
    assert {"npu-266", "npu-2610"} <= {e["cell"] for e in self_hosted}


def test_generator_filters_cells_and_guards_the_empty_matrix():
    only_npu = job_matrices(MATRIX, ["npu-2610"])
    assert [e["cell"] for e in only_npu["self_hosted"]["include"]] == ["npu-2610"]
    assert only_npu["hosted"]["include"] == []  # count 0: the hosted job's `if` skips it
    with pytest.raises(MatrixConfigError, match="no cell named 'gpu'"):
        job_matrices(MATRIX, ["gpu"])


def test_every_job_matrix_comes_from_the_generator():
    jobs = load(ROOT / ".github" / "workflows" / "matrix.yml")["jobs"]
    setup_run = " ".join(step.get("run", "") for step in jobs["setup"]["steps"])
    assert "gdn.matrix.ci" in setup_run
    for name, output in (("hosted-cells", "hosted"), ("self-hosted-cells", "self_hosted")):
        assert jobs[name]["strategy"]["matrix"] == f"${{{{ fromJSON(needs.setup.outputs.{output}) }}}}"
        assert f"needs.setup.outputs.{output}_count != '0'" in jobs[name]["if"]


def payload(event: str, head_repo: str | None = None, count: str = "2") -> dict:
    context = {
        "github": {"event_name": event, "repository": "gdn-org/gdn-matrix"},
        "needs": {"setup": {"outputs": {"self_hosted_count": count}}},
    }
    if head_repo is not None:
        context["github"]["event"] = {"pull_request": {"head": {"repo": {"full_name": head_repo}}}}
    return context


def self_hosted_guard() -> str:
    return load(ROOT / ".github" / "workflows" / "matrix.yml")["jobs"]["self-hosted-cells"]["if"]


@pytest.mark.parametrize(
    ("context", "runs"),
    [
        (payload("pull_request", "someone/gdn-matrix"), False),  # a fork
        (payload("pull_request", "gdn-org/gdn-matrix"), True),  # same repository
        (payload("pull_request", "GDN-ORG/gdn-matrix"), True),  # expression comparison ignores case
        (payload("push"), True),
        (payload("schedule"), True),
        (payload("workflow_dispatch"), True),
        (payload("push", count="0"), False),  # empty matrix
    ],
    ids=["fork-pr", "same-repo-pr", "same-repo-pr-case", "push", "schedule", "dispatch", "empty"],
)
def test_fork_guard_on_self_hosted_jobs(context, runs):
    assert bool(evaluate(self_hosted_guard(), context)) is runs


def test_every_self_hosted_job_has_the_fork_guard():
    for path in WORKFLOWS:
        for name, job in load(path)["jobs"].items():
            runs_on = json.dumps(job.get("runs-on"))
            if "self_hosted" in json.dumps(job.get("strategy", {})) or "self-hosted" in runs_on:
                assert evaluate(job["if"], payload("pull_request", "fork/x")) is False, f"{path.name}:{name}"
