"""Docker cells that break: a build that fails, a container that exits non-zero, one that hangs past
its timeout. Each ends in a report that names the failure while the other cells' results survive,
and an unchanged image is not rebuilt.

These need a docker engine and the local base image (docker/start-dockerd.sh,
docker/make-base-image.sh); .ci/run provides both and sets GDN_DOCKER_TESTS=1, which turns a missing
engine into a failure instead of a skip."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from gdn.matrix.cell import run_cell
from gdn.matrix.config import parse_matrix
from gdn.matrix.report_build import build_report

pytestmark = pytest.mark.tooling

BASE_IMAGE = "gdn-matrix/bookworm-python:local"
DOCKERFILES = {
    "build-fails": "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo 'about to fail' && false\n",
    # the base image has python3 but no `python`: the cell entry cannot start
    "exits-nonzero": "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN useradd -m cell\nUSER cell\n",
    "hangs": (
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n"
        "RUN printf '#!/bin/sh\\necho started; exec sleep 600\\n' > /usr/local/bin/python"
        " && chmod +x /usr/local/bin/python\n"
    ),
}


@pytest.fixture(scope="module")
def engine():
    from gdn.matrix.images import docker_client

    client, reason = docker_client()
    if client is None:
        if os.environ.get("GDN_DOCKER_TESTS") == "1":
            pytest.fail(f"GDN_DOCKER_TESTS=1 but no docker engine: {reason}")
        pytest.skip(f"no docker engine ({reason}); .ci/run starts one and sets GDN_DOCKER_TESTS=1")
    try:
        client.images.get(BASE_IMAGE)
    except Exception as exc:
        pytest.fail(f"docker engine without the base image {BASE_IMAGE}: run docker/make-base-image.sh ({exc})")
    return client


def docker_cell(name: str, **extra) -> dict:
    return {
        "name": name,
        "device": "cpu",
        "runtime": "docker",
        "dockerfile": f"docker/{name}.Dockerfile",
        "base_image": BASE_IMAGE,
        "families": ["probe"],
        **extra,
    }


def source_tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "docker").mkdir(parents=True)
    (root / "tests").mkdir()
    for name, text in DOCKERFILES.items():
        (root / "docker" / f"{name}.Dockerfile").write_text(text)
    return root


def test_broken_cells_are_reported_and_spare_the_others(engine, tmp_path):
    root, results = source_tree(tmp_path), tmp_path / "results"
    matrix = parse_matrix(
        {
            "schema": 1,
            "cells": [
                docker_cell("build-fails"),
                docker_cell("exits-nonzero"),
                docker_cell("hangs", timeout_s=15),
            ],
        }
    )
    survivor = results / "survivor"
    survivor.mkdir(parents=True)
    (survivor / "cell.json").write_text(
        json.dumps({"cell": "survivor", "status": "passed", "device": "cpu", "runtime": "host", "exit_code": 0})
    )
    (survivor / "junit.xml").write_text('<testsuite><testcase classname="t" name="test_ok"/></testsuite>')
    kept = (survivor / "cell.json").read_bytes()

    outcomes = {c.name: run_cell(matrix, c, root, results, echo=lambda line: None) for c in matrix.cells}

    assert outcomes["build-fails"].status == "build_failed"
    assert "about to fail" in outcomes["build-fails"].log_tail
    assert outcomes["exits-nonzero"].status == "error" and outcomes["exits-nonzero"].image
    assert "exited with status" in outcomes["exits-nonzero"].reason
    assert outcomes["hangs"].status == "timeout" and "started" in outcomes["hangs"].log_tail
    assert outcomes["hangs"].duration_s < 120
    assert (survivor / "cell.json").read_bytes() == kept

    report = {c["name"]: c for c in build_report(results, matrix).to_json()["cells"]}
    assert report["build-fails"]["status"] == "build_failed"
    assert report["exits-nonzero"]["status"] == "error" and "exited with status" in report["exits-nonzero"]["reason"]
    assert report["hangs"]["status"] == "timeout"
    assert report["survivor"]["status"] == "passed"


def test_unchanged_image_is_not_rebuilt(engine, tmp_path):
    root, results = source_tree(tmp_path), tmp_path / "results"
    matrix = parse_matrix({"schema": 1, "cells": [docker_cell("exits-nonzero")]})
    first = run_cell(matrix, matrix.cells[0], root, results, echo=lambda line: None)
    second = run_cell(matrix, matrix.cells[0], root, results, echo=lambda line: None)
    assert first.image == second.image and second.image_built is False
    # a change never built before on this engine (a fixed one would be cached by an earlier run)
    (root / "docker" / "exits-nonzero.Dockerfile").write_text(
        DOCKERFILES["exits-nonzero"] + f"ENV CHANGED={uuid.uuid4().hex}\n"
    )
    third = run_cell(matrix, matrix.cells[0], root, results, echo=lambda line: None)
    try:
        assert third.image != first.image and third.image_built is True
    finally:
        # the changed Dockerfile's image is this run's alone (the next run changes it anew): left on
        # the engine, each run of the tests would add one
        if third.image and third.image != first.image:
            engine.images.remove(third.image)


# Stands in for pytest in the base image, which has none: it starts a process of its own, says so in
# the results directory and runs until it is killed.
FAKE_PYTEST = """
import subprocess, sys, time
subprocess.Popen(["sleep", "600"])
open("/results/started", "w").close()
time.sleep(600)
"""


def test_a_container_ends_when_its_runner_is_killed_outright(engine, tmp_path):
    """A container outlives the client that started it: SIGKILL of the runner left the cell running."""
    import shutil
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    from gdn.matrix import images

    root = tmp_path / "src"
    shutil.copytree(Path(images.__file__).parents[2], root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "src" / "pytest").mkdir()
    (root / "src" / "pytest" / "__main__.py").write_text(FAKE_PYTEST)
    (root / "tests").mkdir()
    out = tmp_path / "results" / ".staging" / "killed" / "run-1"
    driver = tmp_path / "driver.py"
    driver.write_text(
        textwrap.dedent(
            f"""
            from pathlib import Path
            from gdn.matrix import images
            from gdn.matrix.config import parse_matrix
            cell = parse_matrix({{"schema": 1, "cells": [{docker_cell("killed")!r}]}}).cells[0]
            client, _ = images.docker_client()
            command = ["python3", "-m", "gdn.matrix.entry", "--cell", "killed", "--out", "/results",
                       "--families", "probe", "--tests", "/src/tests", "--end-with-stdin"]
            images.run_container(client, cell, {BASE_IMAGE!r}, root=Path({str(root)!r}), out_dir=Path({str(out)!r}),
                                 command=command, log=print)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    runner = subprocess.Popen([sys.executable, str(driver)], env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "started").exists():
        assert time.monotonic() < deadline and runner.poll() is None, "the cell never got to its tests"
        time.sleep(0.5)
    label = f"{images.RUN_LABEL}={out.resolve().parent}"
    [container] = engine.containers.list(filters={"label": label})
    runner.send_signal(signal.SIGKILL)
    runner.wait(timeout=30)
    deadline = time.monotonic() + 60
    while container.reload() or container.status == "running":
        assert time.monotonic() < deadline, "the container kept running after its runner died"
        time.sleep(0.5)
    # the next run of the cell removes what the dead one left
    lines: list[str] = []
    cell = parse_matrix({"schema": 1, "cells": [docker_cell("killed")]}).cells[0]
    next_run = out.with_name("run-2")
    images.run_container(engine, cell, BASE_IMAGE, root=root, out_dir=next_run, command=["true"], log=lines.append)
    assert engine.containers.list(all=True, filters={"label": label}) == []
    assert lines[0].endswith("left by a run of this cell whose runner died]")
