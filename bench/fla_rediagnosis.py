"""Which of fla's kernels makes the mini-GRPO update through fla differ from eager on Hopper, with TileLang
and FlashQLA installed (the cuda-flashqla cell's stack), and how far off each is.

The grpo family's step is fp32. fla's FlashQLA backend refuses fp32, so fla runs its own chunk function,
whose backward dispatches `common.chunk_bwd_dqkwg` again: to fla's TileLang backend where tilelang is
installed (on Hopper with Triton >= 3.4), else to fla's Triton kernel, which fla 0.6.0 refuses there
(its Hopper guard). Three configurations, each in a process of its own (fla reads its switches at
import), run side by side on the one GPU:

- `default`: fla as installed beside tilelang and flash-qla;
- `tilelang-off`: FLA_TILELANG=0, so chunk_bwd_dqkwg runs fla's own Triton kernel, with fla's Hopper
  guard lifted in this process only (gdn.backends.fla.bypass_hopper_guard): that kernel is what the
  guard protects users from, and this script measures it, never the adapter;
- `flash-qla-off`: FLA_FLASH_QLA=0, fla's own chunk function for bf16 calls too;
- `ieee`: FLA_TILELANG=0 with the guard lifted, and TRITON_F32_DEFAULT=ieee, so that every fp32 product
  of fla's own Triton kernels that does not name its precision is an IEEE fp32 product instead of
  Triton's default TF32 on Hopper (operands rounded to 10 mantissa bits): a failure that goes away here
  and stays in `tilelang-off` is TF32's.

Each runs `tests/ops/test_grpo.py::test_backend_matches_eager[fla]` (in the process, without xdist, with
gdn's kernel log on: what each call ran at every dispatch level) and then the accuracy table's chunk rows
for fla and eager (fp32 first, then bf16, within a budget) against the fp64 reference. The default
configuration also measures gdn's triton and flashqla backends.

Usage (the H200, peers carried in .whl/peers.tar.xz, see bench/NOTES.md):
    PYTHONPATH=src:.:tests python -m bench.fla_rediagnosis [--configs CONFIG ...] [--grpo CONFIG ...]
Writes bench/results/fla-rediagnosis-<date>.json (and a copy under $OUT).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gdn.matrix.accuracy.table import error_text
from gdn.matrix.timing import environment, write_results

CONFIGS = {
    "default": {},
    "tilelang-off": {"FLA_TILELANG": "0"},
    "flash-qla-off": {"FLA_FLASH_QLA": "0"},
    "ieee": {"FLA_TILELANG": "0", "TRITON_F32_DEFAULT": "ieee"},
}
GUARD_LIFTED = ("tilelang-off", "ieee")
TEST = "tests/ops/test_grpo.py::test_backend_matches_eager[fla]"
ACCURACY_BUDGET_S = 300.0
# a row's call started just before the budget ends may take this long (a peer's first compile)
ACCURACY_MARGIN_S = 60.0
WORKER_TIMEOUT_S = 540.0
ROOT = Path(__file__).resolve().parents[1]


def worker(config: str, out: Path, grpo: bool, deadline: float) -> int:
    """One configuration, in this process: the GRPO comparison (where asked), then the accuracy rows
    within what is left until `deadline` (a time.time())."""
    import pytest

    from gdn.matrix import accuracy

    lift: contextlib.AbstractContextManager = contextlib.nullcontext(False)
    if config in GUARD_LIFTED:
        from gdn.backends.fla import bypass_hopper_guard

        lift = bypass_hopper_guard()
    with lift as lifted:
        (out / "guard.json").write_text(json.dumps({"lifted": bool(lifted)}))
        plugins = ["-p", "gdn.matrix.outcomes", f"--gdn-outcomes={out / 'tests.jsonl'}"]
        plugins += ["-p", "gdn.matrix.kernels_plugin", f"--gdn-kernels={out / 'kernels.json'}"]
        # in this process (no xdist workers), where the guard is lifted if this configuration lifts it
        options = ["-s", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "--rootdir", str(ROOT)]
        if grpo:
            pytest.main([str(ROOT / TEST), *options, *plugins])
        backends = ["eager", "fla", *(("triton", "flashqla") if config == "default" else ())]
        for dtype in ("float32", "bfloat16"):
            rows = ["--backends", *backends, "--ops", "chunk_gated_delta_rule", "--dtypes", dtype]
            files = ["--output", str(out / f"accuracy-{dtype}.json"), "--kernels", str(out / "kernels.json")]
            budget = min(ACCURACY_BUDGET_S / 2, deadline - time.time() - ACCURACY_MARGIN_S)
            if budget > 0:
                accuracy.main([*rows, "--budget-s", f"{budget:.0f}", *files])
    return 0


def collect(config: str, out: Path, log: str, code: int | None) -> dict:
    """What one configuration's worker left: the test's outcome, what it ran, the accuracy rows."""
    found: dict = {"env": CONFIGS[config], "exit_code": code}
    with contextlib.suppress(OSError, ValueError):
        found["hopper_guard_lifted"] = json.loads((out / "guard.json").read_text())["lifted"]
    with contextlib.suppress(OSError, ValueError):
        found["grpo"] = [json.loads(line) for line in (out / "tests.jsonl").read_text().splitlines()]
    with contextlib.suppress(OSError, ValueError):
        found["kernels"] = json.loads((out / "kernels.json").read_text())["steps"]
    found["accuracy"] = []
    for dtype in ("float32", "bfloat16"):
        with contextlib.suppress(OSError, ValueError):
            found["accuracy"] += json.loads((out / f"accuracy-{dtype}.json").read_text())["rows"]
    # the comparison's lines (each quantity of the step against eager) are printed by the test
    found["grpo_lines"] = [line for line in log.splitlines() if "vs eager" in line or "rel" in line][-60:]
    found["log_tail"] = log[-6000:]
    return found


def summary(results: dict) -> list[str]:
    lines = []
    for config, found in results.items():
        [test] = found.get("grpo") or [{}]
        verdict = test.get("outcome", "no result")
        ran = sorted(
            {f"{k['function']} {k['dtype']} -> {k['ran']}" for k in test.get("kernels") or [] if k["level"] != "gdn"}
        )
        lines.append(f"{config}: GRPO [fla] {verdict}: {(test.get('message') or '')[:160]}")
        lines += [f"    ran: {r}" for r in ran]
        for row in found["accuracy"]:
            if row["backend"] == "fla" or config == "default":
                errors = ", ".join(f"{q} {error_text(e)}" for q, e in row["errors"].items())
                lines.append(
                    f"    {row['backend']} {row['dtype']} {row['regime']} {row['layout']}: "
                    f"{errors or row['status'] + ': ' + str(row['reason'])[:120]}"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fla_rediagnosis", description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument(
        "--grpo", nargs="*", choices=list(CONFIGS), help="the configurations that run the GRPO test (default: all)"
    )
    parser.add_argument("--worker", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.out, args.grpo is None or args.worker in args.grpo, args.deadline)
    grpo = ["--grpo", *args.grpo] if args.grpo is not None else []
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="gdn-fla-rediagnosis-") as scratch:
        with contextlib.ExitStack() as logs:
            jobs = {}
            for config in args.configs:
                out = Path(scratch, config)
                out.mkdir()
                env = {k: v for k, v in os.environ.items() if not k.startswith("FLA_")} | CONFIGS[config]
                command = [sys.executable, "-m", "bench.fla_rediagnosis", "--worker", config, "--out", str(out), *grpo]
                command += ["--deadline", str(time.time() + WORKER_TIMEOUT_S)]
                log = logs.enter_context(Path(scratch, f"{config}.log").open("w"))
                jobs[config] = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + WORKER_TIMEOUT_S
            codes = {}
            for config, process in jobs.items():
                try:
                    codes[config] = process.wait(timeout=max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    process.kill()
                    codes[config] = None
        for config, code in codes.items():
            text = Path(scratch, f"{config}.log").read_text(errors="replace")
            results[config] = collect(config, Path(scratch, config), text, code)
    import torch

    stamp = environment("fla-core", "flash-qla", "tilelang", device="cuda" if torch.cuda.is_available() else "cpu")
    payload = {"environment": stamp, "test": TEST, "configs": results}
    path = write_results("fla-rediagnosis", payload)
    print("\n".join(summary(results)))
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
