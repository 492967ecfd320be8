"""The GitHub Actions workflows: schema-valid, yamllint- and zizmor-clean, least privilege, pinned
actions and hash-pinned tool installs, a job matrix generated from matrix.yaml, and no route from a
fork's pull request to a self-hosted runner."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from actions_expr import evaluate
from gdn.matrix import ci
from gdn.matrix.ci import github_outputs, job_matrices
from gdn.matrix.ci import main as ci_main
from gdn.matrix.config import MatrixConfigError, load_matrix
from repo_paths import ROOT

pytestmark = pytest.mark.tooling

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


# The only job that writes: the one publishing the history branch, and only the repository's contents.
WRITERS = {("matrix.yml", "history"): {"contents": "write"}}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_least_privilege_and_pinned_actions(path):
    workflow = load(path)
    assert workflow["permissions"] == {}, "workflow-level permissions must be empty; jobs ask for what they need"
    on = workflow[True] if True in workflow else workflow["on"]  # PyYAML reads the key `on` as True
    assert "pull_request_target" not in on
    for name, job in workflow["jobs"].items():
        assert "permissions" in job, f"job {name} must declare its permissions"
        writes = {scope: level for scope, level in job["permissions"].items() if level != "read"}
        assert writes == WRITERS.get((path.name, name), {}), f"job {name} writes: {job['permissions']}"
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
        assert (by_name[name] in hosted) == ci.github_hosted(cell.runner_labels)
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


def with_labels(labels: list[str]):
    """matrix.yaml with the npu cells' runner labels replaced, as a pull request could replace them."""
    cells = tuple(
        c.model_copy(update={"runner_labels": tuple(labels)}) if c.device == "npu" else c for c in MATRIX.cells
    )
    return MATRIX.model_copy(update={"cells": cells})


NPU_CELLS = {c.name for c in MATRIX.cells if c.device == "npu"}

# runs-on lists that no GitHub-hosted runner answers to: GitHub routes by label alone, so each can
# reach a runner of ours, `self-hosted` named or not.
SELF_HOSTED_ROUTES = {
    "custom-label-alone": ["linux-aarch64-a2-1"],
    "hosted-label-and-custom": ["ubuntu-24.04", "linux-aarch64-a2-1"],
    "two-hosted-labels": ["ubuntu-24.04", "ubuntu-22.04"],  # no hosted runner has both
    "retired-hosted-label": ["ubuntu-20.04"],
    "self-hosted-named": ["self-hosted", "linux-aarch64-a2-1"],
}
HOSTED_ROUTES = {
    "ubuntu": ["ubuntu-24.04"],
    "ubuntu-arm": ["ubuntu-24.04-arm"],
    "windows": ["windows-2022"],
    "macos": ["macos-15"],
    "any-case": ["Ubuntu-Latest"],  # GitHub matches labels without regard to case
}


@pytest.mark.parametrize(
    ("labels", "job"),
    [(v, "self_hosted") for v in SELF_HOSTED_ROUTES.values()] + [(v, "hosted") for v in HOSTED_ROUTES.values()],
    ids=list(SELF_HOSTED_ROUTES) + list(HOSTED_ROUTES),
)
def test_only_a_single_github_hosted_label_goes_to_the_hosted_job(labels, job):
    matrices = job_matrices(with_labels(labels))
    assert {e["cell"] for e in matrices[job]["include"]} >= NPU_CELLS
    other = "hosted" if job == "self_hosted" else "self_hosted"
    assert not NPU_CELLS & {e["cell"] for e in matrices[other]["include"]}


def fork_pr_context(outputs: dict[str, str]) -> dict:
    context = payload("pull_request", "someone/gdn-matrix")
    context["needs"]["setup"]["outputs"] = outputs
    return context


@pytest.mark.parametrize("labels", SELF_HOSTED_ROUTES.values(), ids=list(SELF_HOSTED_ROUTES))
def test_a_fork_pull_request_reaches_no_self_hosted_runner(labels):
    """Through the generator and every job's guard as the workflow has them: with the npu cells on
    labels no hosted runner answers to, a fork's pull request runs none of them."""
    outputs = github_outputs(job_matrices(with_labels(labels)))
    jobs = load(ROOT / ".github" / "workflows" / "matrix.yml")["jobs"]
    reached = set()
    for job in jobs.values():
        source = re.fullmatch(
            r"\$\{\{ fromJSON\(needs\.setup\.outputs\.(\w+)\) \}\}", str(job.get("strategy", {}).get("matrix"))
        )
        if source and evaluate(job["if"], fork_pr_context(outputs)):
            reached |= {e["cell"] for e in json.loads(outputs[source.group(1)])["include"]}
    assert reached, "a fork's pull request still runs the cells on GitHub-hosted runners"
    assert not reached & NPU_CELLS


def test_every_job_a_fork_can_run_is_on_a_github_hosted_label():
    """Each job names a GitHub-hosted label itself, or takes its runner from the generator's hosted
    matrix (which holds nothing else), or has a guard that keeps a fork's pull request out."""
    context = fork_pr_context({"hosted_count": "1", "self_hosted_count": "1"})
    for path in WORKFLOWS:
        for name, job in load(path)["jobs"].items():
            runs_on = job["runs-on"]
            if runs_on == "${{ matrix.runs_on }}":
                if job["strategy"]["matrix"] != "${{ fromJSON(needs.setup.outputs.hosted) }}":
                    assert evaluate(job["if"], context) is False, f"{path.name}:{name}"
            elif not ci.github_hosted([runs_on] if isinstance(runs_on, str) else runs_on):
                assert evaluate(job["if"], context) is False, f"{path.name}:{name}"


def test_the_hosted_job_stops_on_a_self_hosted_runner_before_the_checkout():
    steps = load(ROOT / ".github" / "workflows" / "matrix.yml")["jobs"]["hosted-cells"]["steps"]
    checkout = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/checkout@"))
    tripwires = [
        s
        for s in steps[:checkout]
        if "if" in s
        and evaluate(s["if"], {"runner": {"environment": "self-hosted"}})
        and not evaluate(s["if"], {"runner": {"environment": "github-hosted"}})
    ]
    assert len(tripwires) == 1 and tripwires[0]["run"].rstrip().endswith("exit 1")


TOOLS_LOCK = ".github/requirements/tools.txt"
PIP = {"pip", "pip3", "pipx"}


SEPARATORS = {"&&", "||", ";", "|", "&"}


def _commands(script: str) -> list[list[str]]:
    """The script's simple commands as words, split on the shell's separators outside quotes (a `|`
    inside a quoted `$(...)` is part of its word)."""
    commands: list[list[str]] = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        commands.append([])
        for word in lexer:
            if word in SEPARATORS:
                commands.append([])
            else:
                commands[-1].append(word)
    return commands


def pip_installs(script: str) -> list[list[str]]:
    """The arguments of every `pip install` (also `python -m pip`, `uv pip`, pipx) in a run script."""
    found = []
    for words in _commands(script):
        for i, word in enumerate(words[:-1]):
            if Path(word).name in PIP and words[i + 1] == "install":
                found.append(words[i + 2 :])
    return found


def test_pip_installs_are_found():
    assert pip_installs("python -m pip install a && uv pip install \\\n  b; pipx install c | cat") == [
        ["a"],
        ["b"],
        ["c"],
    ]
    assert pip_installs("pip download torch  # pip install x") == []


def test_every_pip_install_in_the_workflows_uses_the_hash_pinned_lock():
    installs = []
    for path in WORKFLOWS:
        for job in load(path)["jobs"].values():
            for step in job.get("steps", []):
                installs += [(path.name, args) for args in pip_installs(step.get("run", ""))]
    assert len(installs) >= 5
    for where, args in installs:
        assert "--require-hashes" in args, (where, args)
        requirement_files = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-r", "--requirement")]
        assert requirement_files == [TOOLS_LOCK], (where, args)
        positional = [
            a
            for i, a in enumerate(args)
            if not a.startswith("-") and args[i - 1] not in ("-r", "--requirement", "--only-binary")
        ]
        assert positional == [], f"{where}: unpinned {positional}"


def lock_entries() -> list[tuple[Requirement, list[str]]]:
    entries = []
    for line in (ROOT / TOOLS_LOCK).read_text().replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
        if line.strip():
            requirement, *hashes = line.split(" --hash=")
            entries.append((Requirement(requirement.strip()), [h.strip() for h in hashes]))
    return entries


def test_the_tools_lock_pins_every_package_by_version_and_hash():
    entries = lock_entries()
    assert entries
    for requirement, hashes in entries:
        assert len(requirement.specifier) == 1 and next(iter(requirement.specifier)).operator == "==", requirement
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), requirement


def noxfile_script_dependencies() -> list[Requirement]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
        import tomli as tomllib
    block = re.search(r"^# /// script\n(.*?)^# ///$", (ROOT / "noxfile.py").read_text(), re.M | re.S)
    assert block, "noxfile.py has no script block"
    toml = "\n".join(line.removeprefix("#").removeprefix(" ") for line in block.group(1).splitlines())
    return [Requirement(d) for d in tomllib.loads(toml)["dependencies"]]


def test_the_tools_lock_satisfies_the_noxfile_script_block():
    """nox installs whatever of its script block is missing, unpinned, before it reads the noxfile:
    the lock must hold a satisfying version of each (after a change there, lock again: tools.txt's
    header has the command)."""
    pins: dict[str, list[str]] = {}
    for requirement, _ in lock_entries():
        pins.setdefault(canonicalize_name(requirement.name), []).append(next(iter(requirement.specifier)).version)
    for dependency in noxfile_script_dependencies():
        versions = pins.get(canonicalize_name(dependency.name))
        assert versions, f"{dependency} (noxfile script block) is not in {TOOLS_LOCK}"
        assert all(dependency.specifier.contains(v, prereleases=True) for v in versions), (dependency, versions)


COLLECT = ROOT / ".github" / "scripts" / "collect-results.sh"


def test_the_jobs_that_read_the_cells_results_collect_them_with_one_script():
    """The report job and the history job put the downloaded cell artifacts in the results layout the
    same way: both run the one script."""
    jobs = load(ROOT / ".github" / "workflows" / "matrix.yml")["jobs"]
    for name in ("report", "history"):
        steps = jobs[name]["steps"]
        assert any("results-*" in json.dumps(step.get("with", {})) for step in steps), name
        runs = [step.get("run", "") for step in steps]
        assert f"bash {COLLECT.relative_to(ROOT)} downloaded results" in runs, name
        assert not any("downloaded/results-" in run for run in runs), name


def test_collecting_puts_each_cell_artifact_under_its_cell_and_passes_over_the_rest(tmp_path):
    downloaded, results = tmp_path / "downloaded", tmp_path / "results"
    for cell in ("local", "cuda-triton36"):
        (downloaded / f"results-{cell}").mkdir(parents=True)
        (downloaded / f"results-{cell}" / "cell.json").write_text(cell)
    (downloaded / "results-stray").write_text("a file, not an artifact directory")
    (downloaded / "matrix-report").mkdir()
    (results / "report").mkdir(parents=True)  # the history job downloads the report there first
    subprocess.run(["bash", str(COLLECT), str(downloaded), str(results)], check=True)
    assert sorted(p.name for p in results.iterdir()) == ["cuda-triton36", "local", "report"]
    assert (results / "local" / "cell.json").read_text() == "local"


def test_collecting_nothing_leaves_an_empty_results_root(tmp_path):
    """No cell ran (every job skipped): the glob matches nothing, the script still succeeds and the
    report then records every cell as not run."""
    (tmp_path / "downloaded").mkdir()
    subprocess.run(["bash", str(COLLECT), str(tmp_path / "downloaded"), str(tmp_path / "results")], check=True)
    assert list((tmp_path / "results").iterdir()) == []
