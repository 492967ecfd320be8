"""Running cells: each outcome (passed, failed, crashed, timed out, not runnable here) leaves a
results/<cell>/ that says so, and never disturbs another cell's results.

The host runtime runs the real cell entry (probe, then pytest with JUnit output) against a scratch
source tree whose tests/ holds the behaviour each case needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gdn.matrix.cell import run_cell
from gdn.matrix.config import parse_matrix

pytestmark = pytest.mark.tooling

TESTS = {
    "ok": "import pytest\n\n@pytest.mark.probe\ndef test_fine():\n    assert 1 + 1 == 2\n",
    "fails": "import pytest\n\n@pytest.mark.probe\ndef test_broken():\n    assert 1 + 1 == 3, 'arithmetic'\n",
    "hangs": "import time\nimport pytest\n\n@pytest.mark.probe\ndef test_slow():\n    time.sleep(120)\n",
}
# a test of each outcome, then one that never ends: what a run stopped early must still show
TESTS["partly"] = (
    TESTS["ok"]
    + "\n@pytest.mark.probe\ndef test_broken():\n    assert 1 + 1 == 3, 'arithmetic'\n"
    + "\n@pytest.mark.probe\ndef test_elsewhere():\n    pytest.skip('not on this machine')\n"
    + "\n@pytest.mark.probe\ndef test_slow():\n    import time\n    time.sleep(120)\n"
)


def source_tree(tmp_path: Path, kind: str) -> Path:
    root = tmp_path / f"src-{kind}"
    (root / "tests").mkdir(parents=True, exist_ok=True)
    if kind == "crashes":
        (root / "tests" / "conftest.py").write_text("raise RuntimeError('conftest cannot load')\n")
        (root / "tests" / "test_x.py").write_text(TESTS["ok"])
    else:
        (root / "tests" / "test_x.py").write_text(TESTS[kind])
    return root


def matrix_of(*cells: dict):
    return parse_matrix({"schema": 1, "cells": list(cells)})


def host_cell(name: str, **extra) -> dict:
    return {"name": name, "device": "cpu", "runtime": "host", "families": ["probe"], **extra}


def outcome(results: Path, name: str) -> dict:
    return json.loads((results / name / "cell.json").read_text())


def run(tmp_path: Path, kind: str, cell: dict, results: Path) -> dict:
    matrix = matrix_of(cell)
    run_cell(matrix, matrix.cells[0], source_tree(tmp_path, kind), results, echo=lambda line: None)
    return outcome(results, cell["name"])


def test_passing_host_cell_writes_every_result(tmp_path):
    results = tmp_path / "results"
    got = run(tmp_path, "ok", host_cell("good"), results)
    assert got["status"] == "passed" and got["exit_code"] == 0 and got["real_hardware"] is True
    files = {p.name for p in (results / "good").iterdir()}
    assert {"cell.json", "manifest.json", "resolution.json", "junit.xml", "log.txt", "entry.json"} <= files
    manifest = json.loads((results / "good" / "manifest.json").read_text())
    assert manifest["resolution"] == json.loads((results / "good" / "resolution.json").read_text())
    assert 'name="test_fine"' in (results / "good" / "junit.xml").read_text()


def test_a_probe_mode_is_the_probes_alone_and_the_tests_keep_the_compute_mode(tmp_path):
    """The local cell probes under triton (the kernels must serve every op) while its tests run in
    auto: each step sees its own mode."""
    results = tmp_path / "results"
    root = source_tree(tmp_path, "ok")
    (root / "tests" / "test_x.py").write_text(
        "import os\nimport pytest\n\n@pytest.mark.probe\ndef test_mode():\n"
        "    assert os.environ['GDN_COMPUTE_MODE'] == 'auto'\n"
    )
    matrix = matrix_of(host_cell("probed", probe_mode="eager"))
    run_cell(matrix, matrix.cells[0], root, results, echo=lambda line: None)
    assert outcome(results, "probed")["status"] == "passed"
    records = json.loads((results / "probed" / "resolution.json").read_text())
    assert records and {r["requested_mode"] for r in records} == {"eager"}


def test_failing_crashing_and_hanging_cells_say_so_and_spare_the_others(tmp_path):
    results = tmp_path / "results"
    run(tmp_path, "ok", host_cell("good"), results)
    before = {p.name: p.read_bytes() for p in (results / "good").iterdir()}

    failed = run(tmp_path, "fails", host_cell("failing"), results)
    assert failed["status"] == "failed" and failed["exit_code"] == 1
    assert "arithmetic" in failed["log_tail"]

    crashed = run(tmp_path, "crashes", host_cell("crashing"), results)
    assert crashed["status"] == "error" and "exited with status 2" in crashed["reason"]
    assert "conftest cannot load" in (results / "crashing" / "log.txt").read_text()

    hung = run(tmp_path, "hangs", host_cell("hanging", timeout_s=12), results)
    assert hung["status"] == "timeout" and "timeout_s=12" in hung["reason"]
    assert hung["duration_s"] < 60 and hung["log_tail"]
    assert not (results / "hanging" / "junit.xml").exists()

    assert {p.name: p.read_bytes() for p in (results / "good").iterdir()} == before
    assert {p.name for p in results.iterdir() if p.name.startswith(".")} <= {".guards", ".staging"}
    assert not list(results.glob(".staging/*")), "no staging directory left behind"


def test_rerun_replaces_only_that_cell(tmp_path):
    results = tmp_path / "results"
    run(tmp_path, "ok", host_cell("first"), results)
    run(tmp_path, "fails", host_cell("second"), results)
    first = (results / "first" / "cell.json").read_bytes()
    assert run(tmp_path, "ok", host_cell("second"), results)["status"] == "passed"
    assert (results / "first" / "cell.json").read_bytes() == first


def test_npu_cell_without_an_npu_is_not_run_with_the_reason(tmp_path):
    cell = {
        "name": "npu-x",
        "device": "npu",
        "runtime": "docker",
        "dockerfile": "docker/npu.Dockerfile",
        "base_image": "cann:test",
    }
    matrix = matrix_of(cell)
    got = run_cell(
        matrix,
        matrix.cells[0],
        tmp_path,
        tmp_path / "results",
        echo=lambda line: None,
        host_root=tmp_path / "empty-host",
    )
    assert got.status == "not_run" and got.real_hardware is False
    assert got.reason == (
        "/dev/davinci_manager is absent on this machine: npu cells need an Ascend NPU runner (/dev/davinci_manager)"
    )
    assert outcome(tmp_path / "results", "npu-x")["reason"] == got.reason


def test_docker_cell_without_an_engine_points_to_the_host_cell(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    cell = {
        "name": "cpu-x",
        "device": "cpu",
        "runtime": "docker",
        "dockerfile": "docker/cpu.Dockerfile",
        "base_image": "base:test",
    }
    matrix = matrix_of(cell)
    got = run_cell(matrix, matrix.cells[0], tmp_path, tmp_path / "results", echo=lambda line: None)
    assert got.status == "not_run" and "nox -s local" in got.reason
    assert "`gdn-matrix run cpu-x --runtime host` (`nox -s cpu-x -- --runtime host`)" in got.reason


def test_stand_in_modules_found_by_the_probe_are_recorded(tmp_path):
    from gdn.matrix.cell import stand_in_labels

    manifest = tmp_path / "manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "fla_npu": {"stand_in": "fla_npu 26.10 (composite)"},
                "torch_npu": {"stand_in": "torch_npu (cpu)"},
                "python": {"version": "3.11"},
            }
        )
    )
    assert stand_in_labels(manifest) == ["fla_npu 26.10 (composite)", "torch_npu (cpu)"]
    assert stand_in_labels(tmp_path / "missing.json") == []


def docker_cuda_cell(name: str = "cuda-x", **extra) -> dict:
    return {
        "name": name,
        "device": "cuda",
        "runtime": "docker",
        "dockerfile": "docker/cuda.Dockerfile",
        "base_image": "nvidia/cuda:test",
        "families": ["probe"],
        **extra,
    }


def test_docker_cell_in_the_host_runtime_records_it_and_the_pins_it_lacks(tmp_path):
    import platform

    import torch

    host = tmp_path / "gpu-host"
    (host / "dev").mkdir(parents=True)
    (host / "dev" / "nvidiactl").touch()
    python = ".".join(platform.python_version_tuple()[:2])
    pins = {"python": python, "torch": "0.0.1", "fla": "0.6.0"}
    matrix = matrix_of(docker_cuda_cell(versions=pins))
    source = source_tree(tmp_path, "ok")
    got = run_cell(
        matrix, matrix.cells[0], source, tmp_path / "results", echo=lambda line: None, host_root=host, runtime="host"
    )
    assert (got.status, got.runtime, got.matrix_runtime, got.image) == ("passed", "host", "docker", None)
    written = outcome(tmp_path / "results", "cuda-x")
    assert (written["runtime"], written["matrix_runtime"]) == ("host", "docker")
    # this interpreter's torch against the pin, fla (not installed here) against its pin; python matches
    assert written["pin_differences"] == [
        {"package": "torch", "pinned": "0.0.1", "found": torch.__version__},
        {"package": "fla", "pinned": "0.6.0", "found": "not installed"},
    ]
    assert json.loads((tmp_path / "results" / "cuda-x" / "manifest.json").read_text())["python"]["version"].startswith(
        python
    )


def test_host_runtime_still_needs_the_device(tmp_path):
    matrix = matrix_of(docker_cuda_cell())
    got = run_cell(
        matrix,
        matrix.cells[0],
        tmp_path,
        tmp_path / "results",
        echo=lambda line: None,
        host_root=tmp_path / "no-gpu",
        runtime="host",
    )
    assert (got.status, got.runtime, got.matrix_runtime) == ("not_run", "host", "docker")
    assert got.reason == "/dev/nvidiactl is absent on this machine: cuda cells need an NVIDIA GPU (/dev/nvidiactl)"
    assert got.pin_differences is None


def test_run_command_takes_a_runtime_and_refuses_one_the_cell_cannot_have(tmp_path, capsys):
    from gdn.matrix.cli import EXIT_NOT_RUN, main

    path = tmp_path / "matrix.yaml"
    path.write_text(json.dumps({"schema": 1, "cells": [docker_cuda_cell(), host_cell("plain")]}))
    results = tmp_path / "results"
    common = ["--matrix", str(path), "--results", str(results), "--root", str(tmp_path)]
    assert main(["run", "plain", "--runtime", "docker", *common]) == 2
    assert "cell 'plain' cannot run in the docker runtime: " in capsys.readouterr().err
    assert not (results / "plain").exists()
    # no GPU here (GDN_HOST_ROOT points at an empty tree): not run, and recorded as the host runtime;
    # like its nox session (skipped) the command succeeds, unless a run is required
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GDN_HOST_ROOT", str(tmp_path / "no-gpu"))
        patch.delenv("GDN_REQUIRE_RUN", raising=False)
        assert main(["run", "cuda-x", "--runtime", "host", *common]) == 0
        assert outcome(results, "cuda-x")["runtime"] == "host"
        assert main(["run", "cuda-x", "--require-run", *common]) == EXIT_NOT_RUN
        patch.setenv("GDN_REQUIRE_RUN", "1")
        assert main(["run", "cuda-x", *common]) == EXIT_NOT_RUN
    assert outcome(results, "cuda-x")["status"] == "not_run"


def test_a_run_stopped_early_keeps_the_outcomes_of_the_tests_it_finished(tmp_path):
    """junit.xml comes only when pytest ends: a cell stopped by a signal (a CI cancel, a runner's time
    limit) or its timeout names the tests it had finished, the failed ones first of all."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    from gdn.matrix import report_build
    from gdn.matrix.results import read_cell

    results = tmp_path / "results"
    source = source_tree(tmp_path, "partly")
    script = tmp_path / "driver.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path
            from gdn.matrix.cell import run_cell
            from gdn.matrix.config import parse_matrix
            matrix = parse_matrix({{"schema": 1, "cells": [{host_cell("c")!r}]}})
            run_cell(matrix, matrix.cells[0], Path({str(source)!r}), Path({str(results)!r}), echo=lambda line: None)
            """
        )
    )
    driver = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "GDN_TEST_WORKERS": "2"})
    deadline = time.monotonic() + 120
    while len([line for f in results.glob(".staging/c/run-*/tests.jsonl") for line in f.read_text().splitlines()]) < 3:
        assert time.monotonic() < deadline and driver.poll() is None, "the cell never finished its quick tests"
        time.sleep(0.2)
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=60) != 0

    record = json.loads((results / "c" / "interrupted.json").read_text())
    assert record["tests_finished"] == {"passed": 1, "failed": 1, "skipped": 1}
    [failed] = record["tests_failed"]
    assert failed.split(": ", 1)[0].endswith("test_x.py::test_broken") and "arithmetic" in failed
    assert record["reason"] == (
        "interrupted by SIGTERM: no complete run is recorded;"
        " its tests before it stopped: 1 passed, 1 failed, 1 skipped"
    )
    [shown] = report_build.build_report(results).to_json()["cells"]
    assert shown["status"] == "interrupted" and "(failed: " in shown["reason"] and "test_broken" in shown["reason"]

    # a timeout publishes the run: its tests.jsonl stands in for the junit.xml it never wrote
    # the timeout leaves the quick tests time to finish on a loaded machine (test_slow sleeps 120 s)
    got = run(tmp_path, "partly", host_cell("slow", timeout_s=60), results)
    assert got["status"] == "timeout"
    read = read_cell(results / "slow")
    assert sorted((t.name, t.outcome) for t in read.tests) == [
        ("test_broken", "failed"), ("test_elsewhere", "skipped"), ("test_fine", "passed")
    ]  # fmt: skip
    assert (
        "junit.xml is missing: the 3 tests shown are those tests.jsonl recorded before the run ended" in read.problems
    )


def _session_of(pid: int) -> int | None:
    """The session id of a live (not zombie) process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else int(fields[3])


def _processes() -> dict[int, tuple[int, int | None]]:
    """{pid: (parent pid, session id)} of every live process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if fields[0] != "Z":
                found[int(entry.name)] = (int(fields[1]), int(fields[3]))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)")
def test_a_runner_killed_outright_takes_its_tests_with_it_and_is_recorded(tmp_path):
    """SIGKILL of `gdn-matrix run` (the OOM killer, a hard cancel): its cell's pytest, the workers and
    what a test started kept running, orphaned, and the killed run was recorded nowhere."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from gdn.matrix import cli, report_build, report_markdown

    results, late, started = tmp_path / "results", tmp_path / "late.txt", tmp_path / "started.txt"
    matrix_path = tmp_path / "matrix.yaml"
    matrix_path.write_text(json.dumps({"schema": 1, "cells": [host_cell("c")]}))
    run(tmp_path, "ok", host_cell("c"), results)
    good = (results / "c" / "cell.json").read_bytes()
    source = source_tree(tmp_path, "ok")
    grandchild = f"import time; time.sleep(8); open({str(late)!r}, 'w')"
    (source / "tests" / "test_x.py").write_text(
        TESTS["ok"]
        + "\n@pytest.mark.probe\ndef test_slow():\n    import subprocess, sys, time\n"
        + f"    subprocess.Popen([sys.executable, '-c', {grandchild!r}])\n"
        + f"    open({str(started)!r}, 'w').close()\n    time.sleep(120)\n"
    )
    command = [sys.executable, "-m", "gdn.matrix.cli", "run", "c", "--matrix", str(matrix_path)]
    command += ["--root", str(source), "--results", str(results)]
    env = {**os.environ, "GDN_TEST_WORKERS": "2", "PYTHONPATH": str(Path(cli.__file__).parents[2])}
    runner = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not started.exists():
        assert time.monotonic() < deadline and runner.poll() is None, "the slow test never started"
        time.sleep(0.2)
    time.sleep(1)  # its grandchild is on its way
    processes = _processes()
    [entry] = [pid for pid, (parent, _) in processes.items() if parent == runner.pid]
    of_the_run = {pid for pid, (_, session) in processes.items() if session == entry}
    assert len(of_the_run) >= 4, "the entry, pytest, its workers and the test's own process"

    runner.send_signal(signal.SIGKILL)  # to the runner alone, as the OOM killer does
    runner.wait(timeout=30)
    deadline = time.monotonic() + 30
    while alive := {pid for pid in of_the_run if _session_of(pid) == entry}:
        assert time.monotonic() < deadline, f"processes of the killed run still live: {sorted(alive)}"
        time.sleep(0.2)
    time.sleep(9)  # past the moment the test's grandchild would have written its file
    assert not late.exists(), "a process the killed run started kept running"
    assert (results / "c" / "cell.json").read_bytes() == good

    [shown] = report_build.build_report(results).to_json()["cells"]
    assert (shown["status"], shown["verdict"]) == ("passed", "PASSED"), "the last good result is kept"
    record = shown["interrupted"]
    assert (record["signal"], record["runner_died"], record["tests_finished"]) == ("unknown", True, {"passed": 1})
    assert record["reason"].startswith(f"the runner (pid {runner.pid} on ")
    assert "died without recording its end: killed outright (SIGKILL: the OOM killer" in record["reason"]
    assert "the results shown are of the last complete run; its tests before it stopped: 1 passed" in record["reason"]
    assert "a later run died at " in report_markdown.render_markdown(report_build.build_report(results))
    assert json.loads((results / "c" / "interrupted.json").read_text()) == record
    assert not list((results / ".staging").glob("c/*")), "the dead run's staging is cleared"
