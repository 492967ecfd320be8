"""Faults a careless operator (or a hostile results directory) brings to the matrix tooling, one test per
fault (docs/faults.md lists them with what the tooling does): bad fields in results files, malformed
reports given to diff, concurrent and interrupted runs, orphaned test processes, a mistyped --results.

Runs use a fake cell entry (a short Python script in place of `python -m gdn.matrix.entry`), so that a
run takes a second or two and its process tree is known."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gdn.kernel_log import KernelEntry
from gdn.matrix import accuracy, cli, kernels, report_build, report_html, report_markdown, runs
from gdn.matrix import cell as cell_mod
from gdn.matrix.config import parse_matrix
from gdn.matrix.jsonio import write_json
from gdn.matrix.schema import CellOutcome, Failure, FailureRerun, RerunAttempt, RerunsFile
from repo_paths import ROOT as REPO
from report_models import typed

pytestmark = pytest.mark.tooling

RECORD = {"op": "l2norm", "device": "cpu", "backend": "eager", "route": "eager", "rejected": []}


# ---------------------------------------------------------------- results files that do not validate


OUTCOME_XML = {
    "passed": "",
    "failed": '<failure message="AssertionError: boom">trace</failure>',
    "error": '<error message="fixture broke">trace</error>',
    "skipped": '<skipped message="no npu"/>',
}


def _junit(*outcomes: str) -> str:
    """A pytest junit.xml with one probe test per outcome."""
    cases = "".join(
        f'<testcase classname="tests.test_x" name="test_{i}" time="0.01"><properties>'
        f'<property name="family" value="probe"/></properties>{OUTCOME_XML[outcome]}</testcase>'
        for i, outcome in enumerate(outcomes)
    )
    return (
        f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>'
    )


def _cell_dir(root: Path, name: str, status: str = "passed", **fields: Any) -> Path:
    directory = root / name
    CellOutcome(cell=name, status=status, device="cpu", runtime="host", exit_code=0).write(directory)
    write_json(directory / "resolution.json", [RECORD])
    write_json(directory / "manifest.json", {"python": {"version": "3.12.3"}, "resolution": [RECORD]})
    (directory / "junit.xml").write_text(_junit("passed" if status == "passed" else "failed"))
    if fields:
        data = json.loads((directory / "cell.json").read_text())
        write_json(directory / "cell.json", {**data, **fields})
    return directory


def _report_of(root: Path, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """Through the command, as `nox -s report` would: every output written, exit 0."""
    out = tmp_path / "out"
    assert cli.main(["report", "--results", str(root), "--output", str(out)]) == 0
    built = json.loads((out / "report.json").read_text())
    return {c["name"]: c for c in built["cells"]}


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        ("cell.json", {"stand_ins": 5}, "cell.json: stand_ins: Input should be a valid array"),
        ("cell.json", {"log_tail": 123}, "cell.json: log_tail: Input should be a valid string"),
        (
            "resolution.json",
            [{**RECORD, "rejected": 5}],
            "resolution.json: [0].rejected: Input should be a valid array",
        ),
    ],
)
def test_one_bad_field_flags_that_cell_and_spares_the_others(tmp_path, file, content, message):
    root = tmp_path / "results"
    _cell_dir(root, "a-good")
    bad = _cell_dir(root, "b-bad", status="failed", **(content if file == "cell.json" else {}))
    if file != "cell.json":
        write_json(bad / file, content)
    _cell_dir(root, "c-good")
    cells = _report_of(root, tmp_path)
    assert cells["a-good"]["status"] == cells["c-good"]["status"] == "passed"
    assert (cells["b-bad"]["status"], cells["b-bad"]["verdict"]) == ("error", "CRASHED")
    assert cells["b-bad"]["reason"] == f"invalid results: {message}"


def test_resolution_json_that_is_an_object_is_not_a_pass(tmp_path):
    root = tmp_path / "results"
    write_json(_cell_dir(root, "a") / "resolution.json", RECORD)
    cell = _report_of(root, tmp_path)["a"]
    assert cell["status"] == "error"
    assert cell["reason"] == "invalid results: resolution.json: (top level): Input should be a valid array"


def test_manifest_that_is_a_list_is_not_a_pass(tmp_path):
    root = tmp_path / "results"
    write_json(_cell_dir(root, "a") / "manifest.json", [{"python": {"version": "3.12.3"}}])
    cell = _report_of(root, tmp_path)["a"]
    assert cell["status"] == "error"
    assert cell["reason"].startswith("invalid results: manifest.json: (top level): Input should be")


FAILED_LINE = {"nodeid": "tests/test_x.py::test_0", "outcome": "failed", "family": "probe", "message": "boom"}


@pytest.mark.parametrize(
    ("claimed", "files", "fields", "status", "reason"),
    [
        ("passed", {"junit.xml": _junit("passed", "failed")}, {}, "failed",
         "cell.json says passed but junit.xml has 1 failed test"),
        ("passed", {"junit.xml": _junit("error", "error")}, {}, "failed",
         "cell.json says passed but junit.xml has 2 tests in error"),
        ("passed", {"junit.xml": _junit()}, {}, "error", "cell.json says passed but junit.xml holds no test"),
        ("passed", {"junit.xml": None}, {}, "error", "cell.json says passed but junit.xml is missing"),
        ("passed", {}, {"exit_code": 1}, "failed", "cell.json says passed but its exit code is 1"),
        ("passed", {}, {"exit_code": None}, "error", "cell.json says passed but its exit code is None"),
        ("passed", {}, {"duration_s": float("nan")}, "error",
         "invalid results: cell.json: duration_s: NaN is not a finite number"),
        ("passed", {"tests.jsonl": json.dumps(FAILED_LINE) + "\n"}, {}, "failed",
         "cell.json says passed but tests.jsonl has 1 failed test"),
        ("failed", {"junit.xml": None}, {"exit_code": 1}, "error", "cell.json says failed but junit.xml is missing"),
        ("failed", {"junit.xml": _junit("passed", "failed")}, {"exit_code": 1}, "failed", None),
    ],
    ids=["failed-test", "errored-tests", "empty-junit", "no-junit", "exit-code", "no-exit-code", "nan-duration",
         "jsonl-failure", "failed-without-junit", "failed-as-said"],
)  # fmt: skip
def test_a_cells_status_is_the_worst_its_files_show(tmp_path, claimed, files, fields, status, reason):
    """cell.json is one file's claim: the tests, the exit code and the numbers it records must agree."""
    root = tmp_path / "results"
    directory = _cell_dir(root, "a", status=claimed, **fields)
    for name, content in files.items():
        if content is None:
            (directory / name).unlink()
        else:
            (directory / name).write_text(content)
    cell = _report_of(root, tmp_path)["a"]
    verdicts = {"passed": "PASSED", "failed": "FAILED", "error": "CRASHED"}
    assert (cell["status"], cell["reason"], cell["verdict"]) == (status, reason, verdicts[status])
    # report.json is strict JSON whatever the cell held
    json.loads((tmp_path / "out" / "report.json").read_text(), parse_constant=pytest.fail)


def _limited_report(results: Path, out: Path) -> subprocess.CompletedProcess:
    """`gdn-matrix report` under a 2 GiB address-space limit and a minute: a read without bound fails."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    command = [sys.executable, "-m", "gdn.matrix.cli", "report", "--results", str(results), "--output", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    try:
        return subprocess.run(command, capture_output=True, text=True, env=env, preexec_fn=limit, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("gdn-matrix report did not finish in a minute")


def test_results_files_are_read_within_bounds_and_only_when_regular(tmp_path):
    """A bench.json that is a symlink to /dev/zero made the report read without end (MemoryError under
    a 4 GB limit); a FIFO would block it; a file of any size was read whole."""
    from gdn.matrix import jsonio

    root = tmp_path / "results"
    (_cell_dir(root, "a-zero") / "bench.json").symlink_to("/dev/zero")
    fifo = _cell_dir(root, "b-fifo") / "junit.xml"
    fifo.unlink()
    os.mkfifo(fifo)
    (_cell_dir(root, "c-big") / "junit.xml").write_bytes(b" " * (jsonio.RESULTS_FILE_MAX_BYTES + 1))
    (_cell_dir(root, "d-link") / "cell.json").unlink()
    (root / "d-link" / "cell.json").symlink_to(root / "e-good" / "cell.json")
    _cell_dir(root, "e-good")
    done = _limited_report(root, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    cells = {c["name"]: c for c in json.loads((tmp_path / "out" / "report.json").read_text())["cells"]}
    assert cells["a-zero"]["status"] == "error"
    assert cells["a-zero"]["reason"] == "invalid results: bench.json is a symlink, not a regular file"
    assert cells["b-fifo"]["status"] == "error"
    assert "junit.xml is not a regular file" in cells["b-fifo"]["reason"]
    assert cells["c-big"]["status"] == "error"
    assert f"junit.xml is larger than the {jsonio.RESULTS_FILE_MAX_BYTES} bytes" in cells["c-big"]["reason"]
    assert cells["d-link"]["reason"] == "invalid results: cell.json is a symlink, not a regular file"
    assert cells["e-good"]["status"] == "passed"


def test_report_md_stays_under_a_job_summary_however_many_cells_and_failures(tmp_path):
    """The workflow appends report.md to the job summary, which GitHub caps at 1 MiB: one failing cell
    with a 2 MB log line made report.md 2 MB."""
    root = tmp_path / "results"
    _cell_dir(root, "a", status="failed", exit_code=1, log_tail="x" * 2_000_000, reason="y" * 100_000)
    _report_of(root, tmp_path)
    md = (tmp_path / "out" / "report.md").read_bytes()
    assert len(md) < 20_000
    built = report_build.build_report(root)
    [entry] = built.cells
    failures = [Failure(test=f"t::test_{i}", outcome="failed", family="probe", message="m" * 5000) for i in range(500)]
    heavy = replace(entry, failures=failures, problems=["p" * 5000] * 300)
    md = report_markdown.render_markdown(replace(built, cells=[replace(heavy, name=f"cell-{i}") for i in range(3)]))
    assert len(md.encode()) < 200_000
    assert "- … and 480 more (see report.json)" in md and "- **cell-2**: … and 280 more (see report.json)" in md
    # the cells share their strings: 3000 copies of one 6 MB cell would not fit in memory
    md = report_markdown.render_markdown(replace(built, cells=[replace(heavy, name=f"cell-{i}") for i in range(3000)]))
    assert len(md.encode()) < 1 << 20
    assert md.rstrip().endswith("is in report.json and report.html.")


def test_report_of_a_results_directory_that_does_not_exist_is_an_error(tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    assert cli.main(["report", "--results", str(missing), "--output", str(tmp_path / "out")]) == 2
    assert f"no results directory {missing}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_published_schemas_validate_what_the_tooling_writes(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "schemas"
    assert cli.main(["schema", "--output", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    files = (
        "cell",
        "interrupted",
        "manifest",
        "resolution",
        "bench",
        "kernels",
        "accuracy",
        "report",
        "history_entry",
        "bisect",
        "reruns",
    )
    assert names == {f"{n}.schema.json" for n in files}
    root = tmp_path / "results"
    directory = _cell_dir(root, "a")
    _report_of(root, tmp_path)
    written = {
        "cell": directory / "cell.json",
        "resolution": directory / "resolution.json",
        "report": tmp_path / "out" / "report.json",
        "kernels": tmp_path / "kernels.json",
        "accuracy": tmp_path / "accuracy.json",
        # the bisect demonstration's result, as `gdn-matrix bisect` wrote it
        "bisect": REPO / "bench" / "results" / "bisect-cpu-2026-12-05.json",
        "reruns": tmp_path / "reruns.json",
    }
    attempts = [RerunAttempt(7, False, "failed", 1.5, "rel err"), RerunAttempt(8, True, "passed", 1.2)]
    failure = FailureRerun("tests/t.py::test_x", "failed", "seed_dependent", 7, "passed with seed 8", attempts)
    RerunsFile([failure], 10, 2, 3, 600.0, 3.0, True).write(tmp_path)
    entry = KernelEntry("fla", "common.chunk_bwd_dqkwg", "float32", "tilelang", (("x", "why"),), "numeric probe")
    kernels.add_step(written["kernels"], "tests", Counter({entry: 2}))
    accuracy.main(["--ops", "causal_conv1d_update", "--output", str(written["accuracy"])])
    for name, path in written.items():
        schema = json.loads((out / f"{name}.schema.json").read_text())
        jsonschema.validate(json.loads(path.read_text()), schema)
    bad_cell = {**json.loads(written["cell"].read_text()), "stand_ins": 5}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad_cell, json.loads((out / "cell.schema.json").read_text()))


def test_the_writers_inside_a_cell_need_no_pydantic():
    """The cell image carries no pydantic: the entry and the benchmark's models must import without it."""
    code = "import sys; sys.modules['pydantic'] = None; import gdn.matrix.entry, gdn.matrix.schema"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_the_entry_starts_without_pytest():
    """The entry runs the tests' pytest in a process of its own: it starts (and reports a cell whose image
    lacks pytest) without importing it, as the runner's own plugins are loaded only by that process."""
    code = "import sys; sys.modules['pytest'] = None; import gdn.matrix.entry"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ---------------------------------------------------------------- diff on unusable input


def _entry(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "status": "passed",
        "resolution": {"l2norm": {"cpu": {"backend": "eager", "route": "eager", "rejected": []}}},
        "failures": [],
        **fields,
    }


def _diff(tmp_path: Path, old_cells: list, new_cells: list, *extra: str) -> subprocess.CompletedProcess:
    paths = []
    for label, cells in (("old", old_cells), ("new", new_cells)):
        path = tmp_path / f"{label}.json"
        write_json(path, {"schema": 1, "generated_at": "2026-01-01T00:00:00+00:00", "ops": ["l2norm"], "cells": cells})
        paths.append(str(path))
    command = [sys.executable, "-m", "gdn.matrix.cli", "diff", *paths, *extra]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})


@pytest.mark.parametrize(
    ("new", "message"),
    [
        (_entry("a", resolution=[{"op": "l2norm"}]), "cells[0].resolution: Input should be an object"),
        (_entry("a", failures=[{"test": "t::x"}]), "cells[0].failures[0].outcome: Field required"),
    ],
)
def test_diff_of_a_malformed_report_is_unusable_input_not_a_regression(tmp_path, new, message):
    done = _diff(tmp_path, [_entry("a")], [new])
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("threshold", ["nan", "inf", "-0.1"])
def test_diff_refuses_a_threshold_that_is_not_a_finite_fraction(tmp_path, threshold):
    done = _diff(tmp_path, [_entry("a")], [_entry("a")], f"--threshold={threshold}")
    assert done.returncode == 2
    assert "--threshold: must be a finite number >= 0" in done.stderr


def test_diff_refuses_a_report_naming_a_cell_twice(tmp_path):
    done = _diff(tmp_path, [_entry("a")], [_entry("a"), _entry("a", status="failed")])
    assert done.returncode == 2
    assert "names these cells more than once: a" in done.stderr


SPEED_ROW = {"op": "l2norm", "backend": "eager", "shape": {"T": 8}, "pass": "fwd", "ms": 1.0}


@pytest.mark.parametrize(
    ("ms", "said"),
    [
        (float("nan"), "cells[0].bench[0].ms: NaN is not a finite number"),
        (float("inf"), "cells[0].bench[0].ms: Infinity is not a finite number"),
        (0, "cells[0].bench[0].ms: 0 is not a time (a finite number of ms > 0, or null)"),
        (-5, "cells[0].bench[0].ms: -5 is not a time (a finite number of ms > 0, or null)"),
        ("fast", "cells[0].bench[0].ms: 'fast' is not a time (a finite number of ms > 0, or null)"),
        (True, "cells[0].bench[0].ms: True is not a time (a finite number of ms > 0, or null)"),
    ],
    ids=["nan", "inf", "zero", "negative", "text", "bool"],
)
def test_diff_refuses_a_timing_it_cannot_read(tmp_path, ms, said):
    """Each of these gave exit 0, "No regressions.": the row was left out of the comparison."""
    done = _diff(tmp_path, [_entry("a", bench=[SPEED_ROW])], [_entry("a", bench=[{**SPEED_ROW, "ms": ms}])])
    assert done.returncode == 2, done.stdout
    assert f"new.json: {said}" in done.stderr and "Traceback" not in done.stderr


def test_diff_reads_untimed_and_legacy_rows_as_before(tmp_path):
    legacy = {"op": "l2norm", "impl": "eager", "shape": [8], "ms": "n/a"}
    old = [_entry("a", bench=[SPEED_ROW, legacy])]
    done = _diff(tmp_path, old, [_entry("a", bench=[{**SPEED_ROW, "ms": None, "reason": "budget spent"}, legacy])])
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("depth", [100, 100_000])
def test_diff_refuses_nesting_past_its_limit(tmp_path, depth):
    """100,000 levels gave a RecursionError traceback and exit 1, the code of a regression."""
    done = _diff(tmp_path, [_entry("a")], [_entry("a")])
    new = tmp_path / "new.json"
    new.write_text(new.read_text().replace('"failures": []', '"failures": [], "x": ' + "[" * depth + "]" * depth))
    done = subprocess.run(
        done.args, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")}
    )
    assert done.returncode == 2
    assert "new.json" in done.stderr and "nested deeper than 64 levels" in done.stderr
    assert "Traceback" not in done.stderr


def test_diff_refuses_an_output_it_cannot_write(tmp_path):
    """--output naming a directory gave a traceback and exit 1."""
    (tmp_path / "taken").mkdir()
    done = _diff(tmp_path, [_entry("a")], [_entry("a")], "--output", str(tmp_path / "taken"))
    assert done.returncode == 2
    assert f"cannot write --output {tmp_path / 'taken'}: " in done.stderr and "Traceback" not in done.stderr


def test_a_resolution_that_vanished_from_a_cell_still_passing_is_a_regression(tmp_path):
    done = _diff(tmp_path, [_entry("a")], [_entry("a", resolution={})])
    assert done.returncode == 1, done.stdout
    assert "- a: l2norm on cpu moved from eager to not resolved\n" in done.stdout


# ---------------------------------------------------------------- runs: concurrent, interrupted, timed out

MATRIX = {"schema": 1, "cells": [{"name": "c", "device": "cpu", "runtime": "host", "families": ["probe"]}]}
# The fake cell entry: notes its start and end in a shared log, starts a grandchild that writes a file
# after `late_s` (a test process that outlives the entry), then sleeps `sleep_s` and exits 0.
FAKE_ENTRY = textwrap.dedent(
    """
    import subprocess, sys, time
    out, log, late_file, sleep_s, late_s = sys.argv[1:6]
    with open(log, "a") as f:
        f.write(f"start {time.time()} {out}\\n")
    if late_file != "-":
        subprocess.Popen([sys.executable, "-c",
            f"import time; time.sleep({late_s}); open({late_file!r}, 'w').write('late')"])
    time.sleep(float(sleep_s))
    open(out + "/junit.xml", "w").write('<testsuite><testcase classname="t" name="ok"/></testsuite>')
    with open(log, "a") as f:
        f.write(f"end {time.time()} {out}\\n")
    """
)


def _fake_entry(log: Path, sleep_s: float, late_file: Path | None = None, late_s: float = 0.0):
    def command(cell, out, source, python="python"):
        return [python, "-c", FAKE_ENTRY, str(out), str(log), str(late_file or "-"), str(sleep_s), str(late_s)]

    return command


def _good_result(monkeypatch, tmp_path: Path, results: Path) -> bytes:
    monkeypatch.setattr(cell_mod, "entry_command", _fake_entry(tmp_path / "first.log", 0))
    matrix = parse_matrix(MATRIX)
    assert cell_mod.run_cell(matrix, matrix.cells[0], tmp_path, results, echo=lambda line: None).status == "passed"
    return (results / "c" / "cell.json").read_bytes()


def _leftovers(results: Path) -> list[Path]:
    return [p for p in results.glob(".*/**/*") if ".guards" not in p.parts] + list(results.glob(".old-*"))


def test_two_runs_of_one_cell_take_turns_and_strand_nothing(tmp_path, monkeypatch):
    log = tmp_path / "runs.log"
    monkeypatch.setattr(cell_mod, "entry_command", _fake_entry(log, 1.5))
    matrix = parse_matrix(MATRIX)
    results = tmp_path / "results"
    got: list[str] = []

    def one_run() -> None:
        got.append(cell_mod.run_cell(matrix, matrix.cells[0], tmp_path, results, echo=lambda line: None).status)

    runs = [threading.Thread(target=one_run) for _ in range(3)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=60)
    assert got == ["passed"] * 3
    events = [line.split() for line in log.read_text().splitlines()]
    spans = {}
    for kind, at, out in events:
        spans.setdefault(out, {})[kind] = float(at)
    ordered = sorted(spans.values(), key=lambda s: s["start"])
    assert len(ordered) == 3
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(ordered)), f"the runs overlapped: {ordered}"
    assert json.loads((results / "c" / "cell.json").read_text())["status"] == "passed"
    assert (results / "c" / "junit.xml").exists()
    assert _leftovers(results) == []


def _driver(tmp_path: Path, results: Path, late_file: Path, ready: Path) -> subprocess.Popen:
    """run_cell in a process of its own (its own session, as a terminal's job), with the fake entry."""
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            from pathlib import Path
            from gdn.matrix import cell as cell_mod
            from gdn.matrix.config import parse_matrix
            FAKE = {FAKE_ENTRY!r}
            cell_mod.entry_command = lambda cell, out, source, python="python": [
                python, "-c", FAKE, str(out), {str(ready)!r}, {str(late_file)!r}, "60", "4"]
            matrix = parse_matrix({MATRIX!r})
            cell_mod.run_cell(matrix, matrix.cells[0], Path({str(tmp_path)!r}), Path({str(results)!r}),
                              echo=lambda line: None)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    driver = subprocess.Popen([sys.executable, str(script)], env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text()):
        assert time.monotonic() < deadline and driver.poll() is None, "the fake entry never started"
        time.sleep(0.1)
    time.sleep(0.5)  # the grandchild is started right after the entry notes its start
    return driver


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda signum: signum.name)
def test_an_interrupted_run_keeps_the_last_good_result_and_ends_its_processes(tmp_path, monkeypatch, signum):
    """SIGINT as a terminal's Ctrl-C sends it (to the whole process group), SIGTERM as a CI runner's
    cancel does (to the runner alone)."""
    results = tmp_path / "results"
    good = _good_result(monkeypatch, tmp_path, results)
    late_file = tmp_path / "late.txt"
    driver = _driver(tmp_path, results, late_file, tmp_path / "ready.log")
    if signum == signal.SIGINT:
        os.killpg(driver.pid, signum)
    else:
        driver.send_signal(signum)
    assert driver.wait(timeout=30) != 0
    time.sleep(5)  # past the moment the grandchild would have written its file
    assert not late_file.exists(), "a process of the interrupted run kept running"
    assert (results / "c" / "cell.json").read_bytes() == good
    interrupted = json.loads((results / "c" / "interrupted.json").read_text())
    assert interrupted["signal"] == signum.name
    assert interrupted["reason"] == f"interrupted by {signum.name}: the results shown are of the last complete run"
    built = report_build.build_report(results).to_json()
    entry = {c["name"]: c for c in built["cells"]}["c"]
    assert (entry["status"], entry["interrupted"]["signal"]) == ("passed", signum.name)
    shown = f"a later run was interrupted by {signum.name} at {interrupted['interrupted_at']}"
    assert shown in report_markdown.render_markdown(typed(built)) and shown in report_html.render_html(typed(built))
    assert _leftovers(results) == []


def test_a_timeout_ends_the_processes_the_cell_started(tmp_path, monkeypatch):
    late_file = tmp_path / "late.txt"
    monkeypatch.setattr(cell_mod, "entry_command", _fake_entry(tmp_path / "runs.log", 60, late_file, 4))
    matrix = parse_matrix({**MATRIX, "cells": [{**MATRIX["cells"][0], "timeout_s": 2}]})
    results = tmp_path / "results"
    got = cell_mod.run_cell(matrix, matrix.cells[0], tmp_path, results, echo=lambda line: None)
    assert (got.status, got.reason) == ("timeout", "the cell ran past timeout_s=2")
    time.sleep(5)
    assert not late_file.exists(), "a process of the timed-out cell kept running"


def test_a_run_told_not_to_wait_refuses_while_another_holds_the_cell(tmp_path, monkeypatch):
    from filelock import FileLock

    monkeypatch.setattr(cell_mod, "entry_command", _fake_entry(tmp_path / "runs.log", 0))
    matrix = parse_matrix(MATRIX)
    results = tmp_path / "results"
    (results / ".guards").mkdir(parents=True)
    with FileLock(results / ".guards" / "c.guard"), pytest.raises(runs.CellBusyError, match="still holds"):
        cell_mod.run_cell(matrix, matrix.cells[0], tmp_path, results, echo=lambda line: None, wait_s=0)
    assert not (results / "c").exists() and not (tmp_path / "runs.log").exists()


def test_a_cell_whose_only_run_was_interrupted_is_reported_as_such(tmp_path):
    root = tmp_path / "results"
    record = {
        "cell": "c",
        "signal": "SIGTERM",
        "started_at": "2026-01-01T00:00:00+00:00",
        "interrupted_at": "2026-01-01T00:01:00+00:00",
        "reason": "interrupted by SIGTERM: no complete run is recorded",
    }
    write_json(root / "c" / "interrupted.json", record)
    cell = _report_of(root, tmp_path)["c"]
    assert (cell["status"], cell["verdict"], cell["reason"]) == ("interrupted", "MISSING", record["reason"])


def _dead_run(results: Path) -> Path:
    """What a runner killed outright leaves: its marker and its staging directory."""
    staging = results / ".staging" / "c" / "run-dead"
    staging.mkdir(parents=True)
    (staging / "log.txt").write_text("collected 2 items\n")
    (staging / "tests.jsonl").write_text(json.dumps(FAILED_LINE) + "\n")
    marker = {"pid": 999999, "host": "h", "started_at": "2026-01-01T00:00:00+00:00", "staging": "run-dead"}
    write_json(staging.parent / "runner.json", marker)
    return staging


def test_a_dead_runs_marker_is_recorded_by_the_report_or_the_next_run_never_while_a_run_is_live(tmp_path, monkeypatch):
    from filelock import FileLock

    results = tmp_path / "results"
    good = _good_result(monkeypatch, tmp_path, results)
    staging = _dead_run(results)
    with FileLock(results / ".guards" / "c.guard"):  # a live run of the cell: its marker is its own
        assert report_build.build_report(results).to_json()["cells"][0]["interrupted"] is None
        assert (staging.parent / "runner.json").exists() and staging.exists()
    [entry] = report_build.build_report(results).to_json()["cells"]
    record = entry["interrupted"]
    assert (entry["status"], record["signal"], record["runner_died"]) == ("passed", "unknown", True)
    assert record["reason"].startswith("the runner (pid 999999 on h) died without recording its end")
    assert (record["log_tail"], record["tests_failed"]) == ("collected 2 items", ["tests/test_x.py::test_0: boom"])
    assert (results / "c" / "cell.json").read_bytes() == good
    assert not (results / ".staging" / "c").exists() or not any((results / ".staging" / "c").iterdir())

    _dead_run(results)
    said: list[str] = []
    matrix = parse_matrix(MATRIX)
    assert cell_mod.run_cell(matrix, matrix.cells[0], tmp_path, results, echo=said.append).status == "passed"
    assert any(line.startswith("cell c: previous run: the runner (pid 999999 on h) died") for line in said), said
