"""The cell benchmark: every backend that serves an op on this accelerator, timed in one process
through the public call as users make it (gdn's op under the backend's compute mode, so peers are timed
through their adapters), with peak memory and the ratio to the fastest of each (op, shape, pass).

Ops: chunk_gated_delta_rule forward and forward+backward at (B, T, H, HV, K=V) = (1, 8192, 16, 32, 128)
and (4, 4096, 16, 32, 128), bf16, q/k l2norm in the kernel; the state-pool decode
(fused_recurrent_gated_delta_rule_update, one token per sequence) at B = 64 and 256. A backend that is
unavailable or rejected for an op gets a row with the resolver's reason instead of a time; once the
budget (--budget-s, default $GDN_BENCH_BUDGET_S or 180 s) is spent, the rows not yet timed say so:
the budget is a hard limit, a timer interrupts the call in progress.

A peer's first call can autotune or JIT-compile for minutes (on the H200, fla's Triton path about
2 minutes per T bucket alone and more beside other compiles, FlashQLA's TileLang kernels about as long),
one workload after another: that cannot fit in a timing budget of 3 minutes. So the bench starts with a
warm-up: every backend that compiles makes the first calls of each workload (a chunk shape, a decode
batch) in a process of its own, all at once, filling the on-disk caches (Triton's kernels and autotuning
results, TileLang's kernels); their time is the row's first_call_s, a user's cold start in a fresh
process (with whatever the caches on this machine already held). The warm-up has its own cap
(--warm-up-s, default $GDN_BENCH_WARM_UP_S or 240 s): a workload not done by then is ended, and the
timing makes its first calls itself within the timing's budget (its rows say so). The timing that
follows, in this one process, loads what the warm-up compiled and has the budget. Autotuning in the
warm-up shares the device with the other warm-ups, so a peer may pick a slightly different
configuration than it would alone. A runner that keeps its caches (Triton's ~/.triton/cache, TileLang's
~/.tilelang/cache) between runs makes the warm-up take seconds.

Each backend's timed calls run under its `timing(op)` (gdn.backends.base.Backend): where fla's Hopper
guard blocks its gated backward (the manifest's fla section says so), fla is timed with the guard lifted
and its rows say that its gradients are not to be trusted there.

The timing runs with gdn's kernel log on (gdn.matrix.kernels): each row's `implementation` is the route
gdn resolved followed by what the peer's own dispatch ran for the row's calls ("fla:0.6.0 ->
gated_delta_rule.chunk_gated_delta_rule: flash_qla; ..."), and with --kernels the timing's calls are the
"bench" step of the cell's kernels.json.

Usage: python -m gdn.matrix.bench [--matrix-out results/<cell>/bench.json] [--budget-s 180]
Needs a GPU or NPU; without one it says so and exits 0 (cells without an accelerator run no bench).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

import gdn
from gdn.kernel_log import KernelLog
from gdn.matrix.cell import end_group
from gdn.matrix.devices import visible_accelerator as accelerator
from gdn.matrix.kernels import add_step, peer_text, recording
from gdn.matrix.schema import BenchFile, BenchRow, shape_text
from gdn.matrix.timing import (
    chunk_inputs,
    environment,
    median_ms,
    peak_gib,
    pool_decode_inputs,
    print_table,
    write_results,
)
from gdn.resolve import backends, compute_mode_override, resolve

CHUNK = "chunk_gated_delta_rule"
DECODE = "fused_recurrent_gated_delta_rule_update"
CHUNK_SHAPES = ((1, 8192, 16, 32, 128), (4, 4096, 16, 32, 128))
DECODE_BATCHES = (64, 256)
DECODE_HEADS = (16, 32, 128)  # H, HV, K = V
# what one warm-up process compiles, and the order in which the timing goes through them
WORKLOADS: tuple[tuple[str, tuple[int, ...]], ...] = (
    *(("chunk", shape) for shape in CHUNK_SHAPES),
    *(("decode", (B,)) for B in DECODE_BATCHES),
)
BUDGET_S = 180.0
WARM_UP_S = 240.0
# where the cell's entry runs the bench, these set its two budgets (a busy or shared runner needs other ones)
BUDGET_ENV, WARM_UP_ENV = "GDN_BENCH_BUDGET_S", "GDN_BENCH_WARM_UP_S"
# how long an ended warm-up process has to print its stack before what is left of it is killed
SIGTERM_GRACE_S = 5.0
# do_bench budgets in ms: enough for a stable median of kernels of 0.05-40 ms, small enough that every
# backend of every shape fits the cell's three minutes (eager's 35 ms fwd+bwd still gets 3 repeats)
WARMUP_MS, REP_MS = 25, 100
COLUMNS = ["op", "shape", "pass", "backend", "implementation", "ms", "ratio", "peak_gib", "first_call_s", "reason"]


class BudgetSpent(BaseException):
    """Raised by the bench's timer inside a timed call; BaseException so that no handler of a
    backend's own errors swallows it."""


def serving(device: str) -> list[str]:
    """The registered backends that serve the device type, eager last."""
    names = [name for name, b in backends().items() if device in b.devices and name != "eager"]
    return [*names, "eager"]


def timing_order(names: list[str]) -> list[str]:
    """gdn's own backends first, then the peers (Backend.peer: external libraries' adapters, whose first
    calls may autotune or compile for minutes, so the budget must not go to them before gdn's rows
    exist), each group in the resolver's order."""
    registered = backends()
    return sorted(names, key=lambda name: registered[name].peer)


class Cell:
    """The bench of one device. With first_calls_only it is a warm-up process: every pass is called once
    (first_call_s) and each row is appended to rows_out as a JSON line as soon as it is known, so that a
    warm-up ended at the deadline keeps what it finished."""

    def __init__(
        self, device: str, budget_s: float, *, first_calls_only: bool = False, rows_out: Path | None = None
    ) -> None:
        self.device = device
        self.budget_s = budget_s
        self.started = time.monotonic()
        self.rows: list[BenchRow] = []
        self.spent = False
        self.measuring = False
        self.first_calls_only = first_calls_only
        self.rows_out = rows_out
        # from the warm-up: the first call of each row; per (backend, workload) whose warm-up process
        # failed, what a row it did not reach says; per one ended at the cap, the note its rows carry
        self.first_calls: dict[tuple[str, str, str, str], BenchRow] = {}
        self.unreached: dict[tuple[str, int], str] = {}
        self.unfinished: dict[tuple[str, int], str] = {}
        self.workload = 0
        self.log: KernelLog | None = None  # the kernel log in force while timing

    @contextlib.contextmanager
    def deadline(self) -> Iterator[None]:
        """A timer that ends the budget wherever the bench is: inside a measurement it interrupts the call."""

        def expire(_signum, _frame) -> None:
            self.spent = True
            if self.measuring:
                raise BudgetSpent

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, max(self.budget_s - self.elapsed(), 0.001))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def implementation(self, backend: str, op: str) -> tuple[str | None, str | None]:
        """(route actually resolved, None) or (None, why the backend does not serve op here)."""
        try:
            with compute_mode_override(backend):
                res = resolve(op, self.device)
        except Exception as exc:  # GDN_STRICT=1 turns a rejection into an error: it is the reason
            return None, f"{type(exc).__name__}: {exc}"
        if res.backend != backend:
            why = "; ".join(r.reason for r in res.rejected if r.backend == backend)
            return None, why or f"resolved to {res.backend}"
        return res.route, None

    def measure(self, backend: str, op: str, shape: dict[str, int], passes: dict[str, Callable[[], object]], grads):
        with backends()[backend].timing(op) as note:
            route = reason = None
            for name, fn in passes.items():
                row = BenchRow(op, backend, shape, name, note=note)
                mark = self.log.mark() if self.log is not None else None
                self.measuring = True
                try:
                    self.take_first_call(row)
                    if not self.spent and route is None and reason is None:
                        route, reason = self.implementation(backend, op)
                    if not self.spent:
                        row.implementation, row.reason = route, reason or row.reason
                        if reason is None and name == "fwd+bwd" and op in backends()[backend].forward_only:
                            row.reason = "forward-only kernel: calls that need gradients run eager"
                        if row.reason is None:
                            self.time_pass(row, fn, grads)
                            peers = peer_text(self.log.since(mark)) if self.log is not None else ""
                            row.implementation = f"{route} -> {peers}" if peers else route
                except BudgetSpent:
                    row.ms = row.peak_gib = None
                finally:
                    self.measuring = False
                if self.spent and row.ms is None and row.reason is None:
                    # a backend that is not there at all says so rather than blaming the budget
                    missing = None if route else backends()[backend].why_unavailable(self.device)
                    row.implementation = route
                    row.reason = missing or f"not timed: the bench budget of {self.budget_s:.0f} s was spent"
                self.rows.append(row)
                print_row(_printable(row))
                if self.rows_out is not None:
                    with self.rows_out.open("a") as handle:
                        handle.write(json.dumps(row.to_json()) + "\n")

    def take_first_call(self, row: BenchRow) -> None:
        """The warm-up's first call for the row; where its warm-up process failed, the reason; where the
        process was ended at the warm-up's cap, a note: the timing makes the first call itself, within
        its own budget (the warm-up only moves compilation out of the timing's way)."""
        job = (row.backend, self.workload)
        warmed = self.first_calls.get(row.key())
        if warmed is not None:
            row.first_call_s, row.reason = warmed.first_call_s, warmed.reason
        elif job in self.unreached:
            row.reason = self.unreached[job]
        elif job in self.unfinished:
            row.note = "; ".join(filter(None, [row.note, self.unfinished[job]]))

    def time_pass(self, row: BenchRow, fn: Callable[[], object], grads) -> None:
        with compute_mode_override(row.backend):
            try:
                started = time.monotonic()
                fn()
                getattr(torch, self.device).synchronize()
                if row.first_call_s is None:
                    row.first_call_s = round(time.monotonic() - started, 2)
                if self.first_calls_only:
                    return
                row.ms = round(median_ms(fn, grad_to_none=grads, warmup=WARMUP_MS, rep=REP_MS), 4)
                row.peak_gib = round(peak_gib(fn, self.device), 3)
            except Exception as exc:  # a kernel that fails here is a finding, not the end of the bench
                row.ms = row.peak_gib = None
                row.reason = f"raised {type(exc).__name__}: {str(exc)[:300]}"

    def chunk(self, backend: str, B: int, T: int, H: int, HV: int, D: int) -> None:
        inputs = chunk_inputs(B, T, H, HV, D, device=self.device)
        do = torch.randn(B, T, HV, D, device=self.device, dtype=torch.bfloat16)

        def call():
            return gdn.chunk_gated_delta_rule(*inputs, use_qk_l2norm_in_kernel=True)

        def fwd():
            with torch.no_grad():
                return call()

        def fwd_bwd():
            out, _ = call()
            out.backward(do)

        shape = {"B": B, "T": T, "H": H, "HV": HV, "K": D, "V": D}
        self.measure(backend, CHUNK, shape, {"fwd": fwd, "fwd+bwd": fwd_bwd}, inputs)
        getattr(torch, self.device).empty_cache()

    def decode(self, backend: str, B: int) -> None:
        H, HV, D = DECODE_HEADS
        inputs, pool, indices = pool_decode_inputs(B, H, HV, D, D, device=self.device)

        def step():
            return gdn.fused_recurrent_gated_delta_rule_update(*inputs, pool, indices, use_qk_l2norm_in_kernel=True)

        shape = {"B": B, "H": H, "HV": HV, "K": D, "V": D}
        self.measure(backend, DECODE, shape, {"decode": step}, None)

    def rank(self) -> None:
        fastest: dict[tuple[str, str, str], float] = {}
        for row in self.rows:
            if row.ms is not None:
                key = (row.op, shape_text(row.shape), row.pass_)
                fastest[key] = min(fastest.get(key, row.ms), row.ms)
        for row in self.rows:
            if row.ms is not None:
                row.ratio_to_fastest = round(row.ms / fastest[(row.op, shape_text(row.shape), row.pass_)], 3)


ROW_WIDTHS = (24, 32, 8, 9, 28, 9, 6, 9, 13)


def print_row(row: dict) -> None:
    """One row as it is measured, in fixed columns under print_header's names (a long wait shows where)."""
    cells = [f"{row.get(c) if row.get(c) is not None else ''}" for c in COLUMNS]
    print("  ".join(c.ljust(w) for c, w in zip(cells, (*ROW_WIDTHS, 0), strict=True)).rstrip(), flush=True)


def _printable(row: BenchRow) -> dict:
    return {**row.to_json(), "shape": shape_text(row.shape), "ratio": row.ratio_to_fastest}


def run_workload(cell: Cell, backend: str, workload: int) -> None:
    cell.workload = workload
    kind, args = WORKLOADS[workload]
    if kind == "chunk":
        cell.chunk(backend, *args)
    else:
        cell.decode(backend, *args)


def warm_up_command(device: str, backend: str, workload: int, rows_out: Path) -> list[str]:
    return [
        sys.executable, "-m", "gdn.matrix.bench", "--device", device, "--first-calls", backend,
        "--workload", str(workload), "--rows-out", str(rows_out),
    ]  # fmt: skip


def warm_up(cell: Cell, names: list[str], until_s: float) -> None:
    """The first calls of every (backend, workload), each in a process of its own and all at once, until
    until_s into the bench; what a process finished lands in cell.first_calls. A process still running
    then is ended with everything it started (its session), and its rows say how long it had."""
    jobs: dict[tuple[str, int], subprocess.Popen] = {}
    ended: set[tuple[str, int]] = set()
    with tempfile.TemporaryDirectory(prefix="gdn-bench-warm-up-") as scratch:
        for backend in names:
            for workload in range(len(WORKLOADS)):
                rows_out = Path(scratch, f"{backend}-{workload}.jsonl")
                jobs[backend, workload] = subprocess.Popen(
                    warm_up_command(cell.device, backend, workload, rows_out), start_new_session=True
                )
        running = dict(jobs)
        while running and cell.elapsed() < until_s:
            for job, process in list(running.items()):
                if process.poll() is not None:
                    del running[job]
                    print(f"warm-up {job[0]} workload {job[1]}: exit {process.returncode} at {cell.elapsed():.0f} s")
            time.sleep(0.2)
        for job, process in running.items():
            # the process prints where it was (faulthandler) on the SIGTERM that ends it
            print(f"warm-up {job[0]} workload {job[1]}: still running at {until_s:.0f} s, ended")
            ended.add(job)
            end_group(process, SIGTERM_GRACE_S)
        for (backend, workload), process in jobs.items():
            rows_out = Path(scratch, f"{backend}-{workload}.jsonl")
            for line in rows_out.read_text().splitlines() if rows_out.exists() else []:
                row = BenchRow(**_row_fields(json.loads(line)))
                cell.first_calls[row.key()] = row
            if (backend, workload) in ended:
                cell.unfinished[backend, workload] = (
                    f"its warm-up's first calls were not done after {until_s:.0f} s: the timing made them"
                )
            elif process.returncode != 0:
                cell.unreached[backend, workload] = (
                    f"not timed: its warm-up process exited with status {process.returncode}"
                )


def _row_fields(data: dict) -> dict:
    data["pass_"] = data.pop("pass")
    return data


def run(device: str, budget_s: float, warm_up_s: float, kernels: Path | None = None) -> BenchFile:
    started = time.monotonic()
    cell = Cell(device, budget_s)
    names = timing_order(serving(device))
    compiling = [n for n in names if backends()[n].compiles and backends()[n].why_unavailable(device) is None]
    print(f"warm-up: the first calls of {', '.join(compiling) or 'no backend'}, each workload in a process of its own")
    warm_up(cell, compiling, warm_up_s)
    warm_up_elapsed = round(cell.elapsed(), 1)
    print(f"warm-up done after {warm_up_elapsed:.0f} s; timing in this process within {budget_s:.0f} s")
    cell.started = time.monotonic()
    print_row({c: c for c in COLUMNS})
    with recording() as cell.log, cell.deadline():
        for backend in names:
            for workload in range(len(WORKLOADS)):
                run_workload(cell, backend, workload)
    if kernels is not None:
        add_step(kernels, "bench", cell.log.mark())
    cell.rank()
    return BenchFile(
        environment=environment("fla-core", "flash-qla", "tilelang", device=device),
        rows=cell.rows,
        budget_s=budget_s,
        elapsed_s=round(time.monotonic() - started, 1),
        warm_up_s=warm_up_s,
        warm_up_elapsed_s=warm_up_elapsed,
    )


def first_calls(device: str, backend: str, workload: int, rows_out: Path) -> int:
    """A warm-up process: the first call of each pass of one workload of one backend."""
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    cell = Cell(device, float("inf"), first_calls_only=True, rows_out=rows_out)
    run_workload(cell, backend, workload)
    return 0


def seconds_from_env(name: str, default: float) -> float:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise SystemExit(f"gdn.matrix.bench: {name} must be a positive number of seconds, got {text!r}")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gdn.matrix.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--matrix-out", type=Path, help="write the cell's bench.json here")
    parser.add_argument("--kernels", type=Path, help="add what the timing's calls ran to this kernels.json")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=seconds_from_env(BUDGET_ENV, BUDGET_S),
        help=f"the timing's budget (after the warm-up); default ${BUDGET_ENV} or {BUDGET_S:.0f}",
    )
    parser.add_argument(
        "--warm-up-s",
        type=float,
        default=seconds_from_env(WARM_UP_ENV, WARM_UP_S),
        help=f"end the warm-up's first calls after this long; default ${WARM_UP_ENV} or {WARM_UP_S:.0f}",
    )
    warm = parser.add_argument_group("a warm-up process (the bench starts these itself)")
    warm.add_argument("--first-calls", metavar="BACKEND", help="make the first calls of one workload of BACKEND")
    warm.add_argument("--workload", type=int, choices=range(len(WORKLOADS)), default=0)
    warm.add_argument("--rows-out", type=Path, help="append each row as a JSON line here")
    warm.add_argument("--device", help="the accelerator the bench found")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.first_calls:
        return first_calls(args.device, args.first_calls, args.workload, args.rows_out)
    device = accelerator()
    if device is None:
        print("gdn.matrix.bench: needs a GPU or an NPU (none is visible); nothing timed")
        return 0
    bench = run(device, args.budget_s, args.warm_up_s, args.kernels)
    payload = bench.to_json()
    print()
    print_table([_printable(r) for r in bench.rows], COLUMNS)
    card, warm = bench.environment["card"], bench.warm_up_elapsed_s
    print(f"{card}: {len(bench.rows)} rows in {bench.elapsed_s} s, of which {warm} s warm-up")
    if args.matrix_out is not None:
        args.matrix_out.parent.mkdir(parents=True, exist_ok=True)
        args.matrix_out.write_text(json.dumps(payload, indent=2))
    else:
        print(f"written {write_results('cell', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
