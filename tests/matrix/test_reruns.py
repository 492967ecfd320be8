"""Flaky or real: a toy suite whose tests fail deterministically, with one seed only, and flakily (a
file-based counter) is run as a cell's pytest runs it, its failures rerun by the cell's rerun code
(gdn.matrix.reruns) and labelled; the bounds leave what they cut labelled not_rerun; the report
shows each label and a flaky cell as flaky."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdn.matrix import outcomes, reruns
from gdn.matrix.jsonio import write_json
from gdn.matrix.report import write_report
from gdn.matrix.report_build import build_report
from gdn.matrix.results import status_of
from gdn.matrix.schema import CellOutcome, RerunsFile, load_file
from repo_paths import SRC

pytestmark = pytest.mark.tooling

# the seed the toy suite's first run draws for every test, the one its seed-dependent test fails with
FAILING_SEED = 12345
TOY_CONFTEST = """
import pytest
from gdn.matrix.outcomes import draw_seed


@pytest.fixture
def seed(request):
    return draw_seed(request.node)
"""
TOY_TESTS = f"""
import os
from pathlib import Path


def test_passes(seed):
    assert seed >= 0


def test_deterministic(seed):
    assert False, f"fails with every seed ({{seed}})"


def test_seed_dependent(seed):
    assert seed != {FAILING_SEED}, "a tolerance tail of one seed"


def test_flaky(seed):
    counter = Path(os.environ["TOY_COUNTER"])
    runs = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(runs + 1))
    assert runs % 2 == 1, "fails every other run, whatever its seed"


def test_unseeded():
    assert False, "draws no seed"
"""
SAME, FRESH = 2, 2


def _toy_env(tmp: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "TOY_COUNTER": str(tmp / "counter")}
    env.pop(outcomes.SEED_ENV, None)
    return env


@pytest.fixture
def toy_run(tmp_path) -> tuple[Path, Path, dict[str, str]]:
    """The toy suite run once as a cell's pytest runs it (every test drawing FAILING_SEED): (its
    tests directory, the results directory with tests.jsonl, the environment)."""
    tests = tmp_path / "suite" / "tests"
    tests.mkdir(parents=True)
    (tests / "conftest.py").write_text(TOY_CONFTEST)
    (tests / "test_toy.py").write_text(TOY_TESTS)
    out = tmp_path / "out"
    out.mkdir()
    env = _toy_env(tmp_path)
    command = [sys.executable, "-m", "pytest", str(tests), f"--rootdir={tests.parent}", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "no:xdist", "-p", "gdn.matrix.outcomes", f"{outcomes.OPTION}={out / outcomes.FILE}"]
    done = subprocess.run(
        command, cwd=tmp_path, env={**env, outcomes.SEED_ENV: str(FAILING_SEED)}, capture_output=True, text=True
    )
    assert done.returncode == 1, done.stdout + done.stderr
    return tests, out, env


def _by_test(record: RerunsFile) -> dict[str, object]:
    return {failure.test.rpartition("::")[2]: failure for failure in record.failures}


def test_the_seed_of_each_test_travels_into_its_results(toy_run):
    _, out, _ = toy_run
    finished = {t.nodeid.rpartition("::")[2]: t for t in outcomes.read_finished(out / outcomes.FILE)}
    assert finished["test_seed_dependent"].seed == FAILING_SEED
    assert finished["test_passes"].seed == FAILING_SEED
    assert finished["test_unseeded"].seed is None
    assert finished["test_seed_dependent"].nodeid == "tests/test_toy.py::test_seed_dependent"


def test_failures_are_rerun_and_labelled_deterministic_seed_dependent_or_flaky(toy_run, tmp_path):
    tests, out, env = toy_run
    limits = reruns.RerunLimits(max_tests=10, same_seed=SAME, fresh_seed=FRESH, budget_s=300)
    record = reruns.rerun_cell_failures(out, tests, env, tmp_path, limits)
    written, _ = load_file(RerunsFile, out / reruns.FILE)
    assert written == record and record.finished
    found = _by_test(record)
    assert sorted(found) == ["test_deterministic", "test_flaky", "test_seed_dependent", "test_unseeded"]

    deterministic = found["test_deterministic"]
    assert deterministic.label == "deterministic"
    assert [(a.fresh_seed, a.outcome) for a in deterministic.attempts] == [(False, "failed")] * SAME + [
        (True, "failed")
    ] * FRESH
    own = [a.seed for a in deterministic.attempts if not a.fresh_seed]
    fresh = [a.seed for a in deterministic.attempts if a.fresh_seed]
    assert own == [FAILING_SEED] * SAME
    assert all(seed is not None and seed != FAILING_SEED for seed in fresh)

    seeded = found["test_seed_dependent"]
    assert seeded.label == "seed_dependent", seeded
    assert [(a.seed, a.outcome) for a in seeded.attempts[:SAME]] == [(FAILING_SEED, "failed")] * SAME
    assert seeded.attempts[-1].fresh_seed and seeded.attempts[-1].outcome == "passed"
    assert f"passed with seed {seeded.attempts[-1].seed}" in seeded.reason

    flaky = found["test_flaky"]
    assert flaky.label == "flaky"
    assert [(a.seed, a.fresh_seed, a.outcome) for a in flaky.attempts] == [(FAILING_SEED, False, "passed")]

    # nothing to vary: its reruns are reruns as it is, and failing them all is deterministic
    unseeded = found["test_unseeded"]
    assert unseeded.label == "deterministic"
    assert [(a.seed, a.fresh_seed, a.outcome) for a in unseeded.attempts] == [(None, False, "failed")] * SAME
    assert not reruns.only_flaky(record)


def test_what_the_bounds_cut_is_labelled_not_rerun_never_deterministic(toy_run, tmp_path):
    tests, out, env = toy_run
    limits = reruns.RerunLimits(max_tests=1, same_seed=SAME, fresh_seed=FRESH, budget_s=0)
    found = _by_test(reruns.rerun_cell_failures(out, tests, env, tmp_path, limits))
    assert {name: f.label for name, f in found.items()} == dict.fromkeys(found, "not_rerun")
    assert all(not f.attempts for f in found.values())
    assert found["test_deterministic"].reason == f"the rerun budget (0 s) was spent after 0 of {SAME + FRESH} reruns"
    assert found["test_flaky"].reason == "past the first 1 failing tests, which alone are rerun"


def test_a_cell_killed_during_its_reruns_leaves_its_failures_not_rerun(toy_run, tmp_path):
    """reruns.json is written before the first rerun: what a killed cell leaves says not_rerun."""
    tests, out, env = toy_run
    seen = []

    def kill_at_first_rerun(*_args, **_kwargs):
        seen.append(load_file(RerunsFile, out / reruns.FILE)[0])
        raise KeyboardInterrupt

    original = reruns._rerun_once
    reruns._rerun_once = kill_at_first_rerun
    try:
        with pytest.raises(KeyboardInterrupt):
            reruns.rerun_cell_failures(out, tests, env, tmp_path)
    finally:
        reruns._rerun_once = original
    left = seen[0]
    assert not left.finished
    assert {f.label for f in left.failures} == {"not_rerun"}
    assert left.failures[0].reason == "the cell ended before its reruns"


# ---------------------------------------------------------------- the report


def _junit(names: list[str]) -> str:
    cases = "".join(
        f'<testcase classname="tests.test_toy" name="{name}" time="0.1">'
        '<properties><property name="family" value="single_op"/></properties>'
        '<failure message="AssertionError: tail">trace</failure></testcase>'
        for name in names
    )
    return (
        f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>'
    )


def _flaky_cell(root: Path, *, status: str, label: str) -> Path:
    directory = root / "toy"
    directory.mkdir(parents=True)
    code = {"flaky": reruns.FLAKY_EXIT, "failed": 1}[status]
    CellOutcome(cell="toy", status=status, device="cpu", runtime="host", exit_code=code).write(directory)
    (directory / "junit.xml").write_text(_junit(["test_tail"]))
    line = {"nodeid": "tests/test_toy.py::test_tail", "outcome": "failed", "family": "single_op", "seed": 7}
    (directory / outcomes.FILE).write_text(json.dumps(line) + "\n")
    attempt = {"seed": 7, "fresh_seed": False, "outcome": "passed" if label == "flaky" else "failed", "duration_s": 0.5}
    write_json(
        directory / reruns.FILE,
        {
            "failures": [
                {
                    "test": "tests/test_toy.py::test_tail",
                    "outcome": "failed",
                    "label": label,
                    "seed": 7,
                    "reason": "passed on rerun 1 with its own seed" if label == "flaky" else "failed all 5 reruns",
                    "attempts": [attempt],
                }
            ],
            "max_tests": 10,
            "same_seed_reruns": 2,
            "fresh_seed_reruns": 3,
            "budget_s": 600.0,
            "elapsed_s": 1.0,
            "finished": True,
        },
    )
    return root


def test_the_report_shows_each_failures_label_and_a_flaky_cell_as_flaky(tmp_path):
    assert status_of(reruns.FLAKY_EXIT) == "flaky"
    root = _flaky_cell(tmp_path / "results", status="flaky", label="flaky")
    report = build_report(root)
    cell = report.cells[0]
    assert (cell.status, cell.verdict) == ("flaky", "FAILED")
    assert "each passed on a rerun with its own seed" in cell.reason
    failure = cell.failures[0]
    assert (failure.test, failure.label, failure.seed) == ("tests.test_toy::test_tail", "flaky", 7)
    assert failure.reruns[0].outcome == "passed"
    paths = write_report(report, tmp_path / "report")
    saved = json.loads(paths["json"].read_text())["cells"][0]
    assert saved["status"] == "flaky" and saved["failures"][0]["label"] == "flaky"
    text = "flaky: passed on rerun 1 with its own seed; GDN_TEST_SEED=7"
    assert text in paths["md"].read_text()
    assert text in paths["html"].read_text()


def test_a_cell_that_says_flaky_with_a_failure_its_reruns_did_not_label_flaky_is_failed(tmp_path):
    root = _flaky_cell(tmp_path / "results", status="flaky", label="deterministic")
    cell = build_report(root).cells[0]
    assert cell.status == "failed"
    assert "reruns.json does not label tests.test_toy::test_tail flaky (deterministic)" in cell.reason


def test_a_failure_without_recorded_reruns_is_not_rerun(tmp_path):
    root = _flaky_cell(tmp_path / "results", status="failed", label="deterministic")
    (root / "toy" / reruns.FILE).unlink()
    failure = build_report(root).cells[0].failures[0]
    assert (failure.label, failure.label_reason, failure.seed) == ("not_rerun", "no reruns.json", 7)


def test_the_cell_entry_reruns_its_failures_and_a_cell_failing_only_flakily_exits_flaky(tmp_path, monkeypatch):
    """The entry's own pytest step over a suite whose one failure is flaky, then its rerun step: exit
    status 3, which the runner reads as flaky. The probe and the accuracy table are not this test's."""
    from gdn.matrix import entry

    tests = tmp_path / "suite" / "tests"
    tests.mkdir(parents=True)
    (tests / "conftest.py").write_text(TOY_CONFTEST)
    flaky = TOY_TESTS[TOY_TESTS.index("def test_flaky") : TOY_TESTS.index("def test_unseeded")]
    (tests / "test_toy.py").write_text(
        "import os\nfrom pathlib import Path\nimport pytest\n\n\n@pytest.mark.single_op\n" + flaky
    )
    for name, value in {**_toy_env(tmp_path), "TMPDIR": str(tmp_path), "GDN_TEST_WORKERS": "0"}.items():
        monkeypatch.setenv(name, value)
    step = entry._step

    def only_the_tests(name, command, cwd, env):
        return step(name, command, cwd, env) if name == "pytest" else {"step": name, "exit_code": 0, "duration_s": 0}

    monkeypatch.setattr(entry, "_step", only_the_tests)
    out = tmp_path / "out"
    args = entry.PROGRAM.parser().parse_args(["--cell", "toy", "--out", str(out), "--families", "single_op"])
    args.tests = tests
    code = entry._run(args)
    record, _ = load_file(RerunsFile, out / reruns.FILE)
    assert [(f.label, len(f.attempts)) for f in record.failures] == [("flaky", 1)]
    assert code == reruns.FLAKY_EXIT and status_of(code) == "flaky"
    steps = json.loads((out / "entry.json").read_text())["steps"]
    assert [s["step"] for s in steps] == ["manifest", "accuracy", "pytest", "reruns"]
