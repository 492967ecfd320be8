"""The cell benchmark: every backend that serves an op on this accelerator, timed in one process
through the public call as users make it (gdn's op under the backend's compute mode, so peers are timed
through their adapters), with peak memory and the ratio to the fastest of each (op, shape, pass).

Ops: chunk_gated_delta_rule forward and forward+backward at (B, T, H, HV, K=V) = (1, 8192, 16, 32, 128)
and (4, 4096, 16, 32, 128), bf16, q/k l2norm in the kernel; the state-pool decode
(fused_recurrent_gated_delta_rule_update, one token per sequence) at B = 64 and 256. A backend that is
unavailable or rejected for an op gets a row with the resolver's reason instead of a time; once the
budget (--budget-s, default 180 s) is spent, the rows not yet timed say so: the budget is a hard limit,
a timer interrupts the call in progress (a peer's first call can autotune or JIT-compile for minutes).
gdn's own backends are timed first, the peers after them. The first call of each pass is timed on its
own (first_call_s): it carries compilation and autotuning, a user's cold start.

Where fla's Hopper guard blocks its gated backward (the manifest's fla section says so), fla is timed
with the guard lifted and its rows say that its gradients are not to be trusted there.

Usage: PYTHONPATH=src:. python -m bench.cell [--matrix-out results/<cell>/bench.json] [--budget-s 180]
Needs a GPU or NPU; without one it says so and exits 0 (cells without an accelerator run no bench).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

import gdn
from bench._common import chunk_inputs, environment, median_ms, peak_gib, pool_decode_inputs, print_table, write_results
from gdn.matrix.schema import BenchFile, BenchRow, shape_text
from gdn.resolve import backends, compute_mode_override, resolve

CHUNK = "chunk_gated_delta_rule"
DECODE = "fused_recurrent_gated_delta_rule_update"
CHUNK_SHAPES = ((1, 8192, 16, 32, 128), (4, 4096, 16, 32, 128))
DECODE_BATCHES = (64, 256)
DECODE_HEADS = (16, 32, 128)  # H, HV, K = V
BUDGET_S = 180.0
# do_bench budgets in ms: enough for a stable median of kernels of 0.05-40 ms, small enough that every
# backend of every shape fits the cell's three minutes (eager's 35 ms fwd+bwd still gets 3 repeats)
WARMUP_MS, REP_MS = 25, 100
COLUMNS = ["op", "shape", "pass", "backend", "implementation", "ms", "ratio", "peak_gib", "first_call_s", "reason"]
# external libraries' adapters: timed after gdn's own backends, since their first calls may autotune or
# compile for minutes and the budget must not go to them before gdn's rows exist
PEERS = ("fla", "flashqla")


class BudgetSpent(BaseException):
    """Raised by the bench's timer inside a timed call; BaseException so that no handler of a
    backend's own errors swallows it."""


def accelerator() -> str | None:
    if torch.cuda.is_available():
        return "cuda"
    with contextlib.suppress(Exception):  # torch_npu absent or without CANN: no NPU
        import torch_npu  # noqa: F401

        if torch.npu.is_available():
            return "npu"
    return None


def serving(device: str) -> list[str]:
    """The registered backends that serve the device type, eager last."""
    names = [name for name, b in backends().items() if device in b.devices and name != "eager"]
    return [*names, "eager"]


def timing_order(names: list[str]) -> list[str]:
    """gdn's own backends first, then the peers, each group in the resolver's order."""
    return sorted(names, key=lambda name: name in PEERS)


def fla_kernel() -> tuple[str | None, bool]:
    """The kernel fla's own dispatch takes for the chunk op here, and whether its Hopper guard blocks."""
    try:
        from gdn.backends import fla_dispatch

        described = fla_dispatch.describe()
    except Exception:  # fla does not import: its resolution says why
        return None, False
    guard = described.get("hopper_guard") or {}
    return (described.get("chunk") or {}).get("chosen"), bool(guard.get("blocks_gated_backward"))


class Cell:
    def __init__(self, device: str, budget_s: float) -> None:
        self.device = device
        self.budget_s = budget_s
        self.started = time.monotonic()
        self.rows: list[BenchRow] = []
        self.fla_chunk, self.fla_guard_blocks = fla_kernel()
        self.spent = False
        self.measuring = False

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

    @contextlib.contextmanager
    def peer_context(self, backend: str, op: str) -> Iterator[str | None]:
        """fla's Hopper guard lifted around its chunk rows where it blocks them (timing only)."""
        if backend == "fla" and op == CHUNK and self.fla_guard_blocks:
            from gdn.backends.fla import bypass_hopper_guard

            with bypass_hopper_guard():
                yield "fla's Hopper guard lifted for timing: its gated backward is wrong with this Triton here"
            return
        yield None

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
        route = res.route
        if backend == "fla" and op == CHUNK and self.fla_chunk:
            route = f"{route} -> {self.fla_chunk}"
        return route, None

    def measure(self, backend: str, op: str, shape: dict[str, int], passes: dict[str, Callable[[], object]], grads):
        with self.peer_context(backend, op) as note:
            route = reason = None
            for name, fn in passes.items():
                row = BenchRow(op, backend, shape, name, note=note)
                self.measuring = True
                try:
                    if not self.spent and route is None and reason is None:
                        route, reason = self.implementation(backend, op)
                    if not self.spent:
                        row.implementation, row.reason = route, reason
                        if reason is None and name == "fwd+bwd" and op in backends()[backend].forward_only:
                            row.reason = "forward-only kernel: calls that need gradients run eager"
                        if row.reason is None:
                            self.time_pass(row, fn, grads)
                except BudgetSpent:
                    row.ms = row.peak_gib = row.first_call_s = None
                finally:
                    self.measuring = False
                if self.spent and row.ms is None and row.reason is None:
                    # a backend that is not there at all says so rather than blaming the budget
                    missing = None if route else backends()[backend].why_unavailable(self.device)
                    row.implementation = route
                    row.reason = missing or f"not timed: the bench budget of {self.budget_s:.0f} s was spent"
                self.rows.append(row)
                print_row(_printable(row))

    def time_pass(self, row: BenchRow, fn: Callable[[], object], grads) -> None:
        with compute_mode_override(row.backend):
            try:
                started = time.monotonic()
                fn()
                getattr(torch, self.device).synchronize()
                row.first_call_s = round(time.monotonic() - started, 2)
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


def run(device: str, budget_s: float) -> BenchFile:
    cell = Cell(device, budget_s)
    print_row({c: c for c in COLUMNS})
    with cell.deadline():
        for backend in timing_order(serving(device)):
            for shape in CHUNK_SHAPES:
                cell.chunk(backend, *shape)
            for B in DECODE_BATCHES:
                cell.decode(backend, B)
    cell.rank()
    env = environment("fla-core", "flash-qla", "tilelang", device=device)
    return BenchFile(environment=env, rows=cell.rows, budget_s=budget_s, elapsed_s=round(cell.elapsed(), 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cell", description=__doc__.splitlines()[0])
    parser.add_argument("--matrix-out", type=Path, help="write the cell's bench.json here")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="stop timing new rows after this long")
    args = parser.parse_args(argv)
    device = accelerator()
    if device is None:
        print("bench.cell: needs a GPU or an NPU (none is visible); nothing timed")
        return 0
    bench = run(device, args.budget_s)
    payload = bench.to_json()
    print()
    print_table([_printable(r) for r in bench.rows], COLUMNS)
    print(f"{bench.environment['card']}: {len(bench.rows)} rows in {bench.elapsed_s} s")
    if args.matrix_out is not None:
        args.matrix_out.parent.mkdir(parents=True, exist_ok=True)
        args.matrix_out.write_text(json.dumps(payload, indent=2))
    else:
        print(f"written {write_results('cell', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
