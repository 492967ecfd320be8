"""What runs inside a cell (a container, or the host for host-runtime cells): the probe, then the
accuracy table, then the cell's test families under pytest with JUnit output, then the reruns of the
tests that failed (each labelled deterministic, seed-dependent or flaky: gdn.matrix.reruns), then the
optional benchmark; gdn's kernel log records what each step's calls ran (kernels.json). Everything goes
to the output directory (see gdn.matrix.results); the exit status says how it went: 0 all passed, 1
tests failed, 3 tests failed and every failure passed on a rerun with its own seed (flaky), 2 the cell
itself broke (probe crash, no tests collected, ...).

    python -m gdn.matrix.entry --cell NAME --out DIR --families probe,single_op [--mode auto] [--probe-mode M]
        [--bench] [--end-with-stdin]

With --end-with-stdin the runner holds the other end of the entry's stdin and never writes to it: when
the pipe closes, the runner is gone (killed outright: SIGKILL, the OOM killer, a hard cancel, which it
cannot answer), and the entry kills its whole process group, pytest and everything a test started with
it, then itself. In a container the pipe is the container's stdin, which the engine closes when the
runner's attachment to it ends.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

from gdn.matrix import kernels, outcomes, reruns
from gdn.matrix.accuracy import FILE as ACCURACY
from gdn.matrix.jsonio import write_json
from gdn.matrix.program import Program
from gdn.matrix.results import FAMILY_MARKERS

SOURCE_ROOT = Path(__file__).resolve().parents[3]  # the checkout: src/gdn/matrix/entry.py -> repo root
PYTEST_NO_TESTS = 5


def _step(name: str, command: list[str], cwd: Path, env: dict[str, str]) -> dict:
    print(f"== {name}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    # stdin stays the entry's: the pipe from the runner, which it alone watches
    code = subprocess.call(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL)
    return {"step": name, "exit_code": code, "duration_s": round(time.monotonic() - started, 2)}


def _pytest_command(args: argparse.Namespace) -> list[str]:
    command = [sys.executable, "-m", "pytest", str(args.tests), "-m", " or ".join(args.families)]
    # the root their node ids are relative to, as the reruns give it (gdn.matrix.reruns)
    command += [
        f"--rootdir={args.tests.parent}",
        f"--junitxml={args.out / 'junit.xml'}",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    command += ["-p", "gdn.matrix.outcomes", f"{outcomes.OPTION}={args.out / outcomes.FILE}"]
    command += ["-p", "gdn.matrix.kernels_plugin", f"{kernels.OPTION}={args.out / kernels.FILE}"]
    if importlib.util.find_spec("xdist") is not None:
        command += ["-n", os.environ.get("GDN_TEST_WORKERS", "auto")]
    return command


def share_with_group(out: Path) -> None:
    """Let the results directory's group read what this process wrote: in a container the runner reads
    the results through that group (gdn.matrix.images), and atomic writes leave files 0600."""
    for path in [out, *out.rglob("*")]:
        if path.is_symlink():  # chmod would follow it out of the directory
            continue
        with contextlib.suppress(OSError):  # not ours (the runner's own files), or gone meanwhile
            extra = stat.S_IRWXG if path.is_dir() else stat.S_IRGRP
            path.chmod(stat.S_IMODE(path.stat().st_mode) | extra)


def _watch_the_runner() -> None:
    """Kill this process group, this process last, once stdin reaches its end: the runner that holds the
    pipe's other end has died (see the module's docstring)."""
    while os.read(0, 1 << 16):  # the runner writes nothing; b"" is its end
        pass
    # In a container this process is PID 1, which its own group's SIGKILL does not reach.
    os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(128 + signal.SIGKILL)


def run(args: argparse.Namespace) -> int:
    if args.end_with_stdin:
        threading.Thread(target=_watch_the_runner, name="gdn-runner-watch", daemon=True).start()
    try:
        return _run(args)
    finally:
        share_with_group(args.out)


def _run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    # unbuffered: a container's or a CI log shows the tests as they finish, not all at once at the end
    env = {**os.environ, "GDN_COMPUTE_MODE": args.mode, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    # The source may be mounted read-only: run from a scratch directory (hypothesis keeps its
    # database in the working directory).
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"gdn-cell-{args.cell}"
    scratch.mkdir(parents=True, exist_ok=True)
    steps = [
        _step(
            "manifest",
            [sys.executable, "-m", "gdn.matrix.probe", "--output", str(args.out / "manifest.json")],
            scratch,
            {**env, "GDN_COMPUTE_MODE": args.probe_mode or args.mode},
        )
    ]
    manifest_path = args.out / "manifest.json"
    if manifest_path.exists():
        write_json(args.out / "resolution.json", json.loads(manifest_path.read_text()).get("resolution", []))
    # The accuracy table runs before the tests: a failing cell's log then ends with pytest's failures,
    # which its log tail (the report's reason) must show, not with the table's rows.
    accuracy = [sys.executable, "-m", "gdn.matrix.accuracy", "--output", str(args.out / ACCURACY)]
    steps.append(_step("accuracy", [*accuracy, "--kernels", str(args.out / kernels.FILE)], scratch, env))
    steps.append(_step("pytest", _pytest_command(args), scratch, env))
    flaky = False
    if steps[-1]["exit_code"] == 1:
        print(f"== reruns: the failing tests, their own seed then fresh seeds -> {reruns.FILE}", flush=True)
        started = time.monotonic()
        record = reruns.rerun_cell_failures(args.out, args.tests, env, scratch)
        for failure in record.failures:
            print(f"{failure.label}: {failure.test} ({failure.reason})", flush=True)
        flaky = reruns.only_flaky(record)
        steps.append({"step": "reruns", "exit_code": 0, "duration_s": round(time.monotonic() - started, 2)})
    if args.bench:
        bench_cmd = [sys.executable, "-m", "gdn.matrix.bench", "--matrix-out", str(args.out / "bench.json")]
        bench_cmd += ["--kernels", str(args.out / kernels.FILE)]
        steps.append(_step("bench", bench_cmd, scratch, env))
    write_json(args.out / "entry.json", {"cell": args.cell, "families": args.families, "steps": steps})
    codes = {s["step"]: s["exit_code"] for s in steps}
    if codes["manifest"] != 0 or codes["pytest"] not in (0, 1) or codes["accuracy"] != 0 or codes.get("bench", 0) != 0:
        return 2
    return reruns.FLAKY_EXIT if flaky else codes["pytest"]


def _families(text: str) -> list[str]:
    families = [f for f in text.split(",") if f]
    unknown = sorted(set(families) - set(FAMILY_MARKERS))
    if unknown or not families:
        raise argparse.ArgumentTypeError(f"expected families from {list(FAMILY_MARKERS)}, got {text!r}")
    return families


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cell", required=True)
    parser.add_argument("--out", type=Path, required=True, help="the cell's results directory")
    parser.add_argument("--families", type=_families, default=list(FAMILY_MARKERS))
    parser.add_argument("--mode", default="auto", help="gdn compute mode for the probe and the tests")
    parser.add_argument("--probe-mode", help="gdn compute mode for the probe alone (default: --mode)")
    parser.add_argument("--bench", action="store_true", help="also run the benchmarks (GPU cells)")
    parser.add_argument("--tests", type=Path, default=SOURCE_ROOT / "tests")
    parser.add_argument(
        "--end-with-stdin",
        action="store_true",
        help="end the whole process group when stdin closes (the runner holds its other end)",
    )


PROGRAM = Program("python -m gdn.matrix.entry", __doc__.splitlines()[0], add_arguments, run)
main = PROGRAM.main


if __name__ == "__main__":
    sys.exit(main())
