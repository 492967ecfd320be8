"""What a cell's run really ran: gdn's kernel log (gdn.kernel_log) turned on, with every peer's own
dispatch watched, while the cell runs its test families (gdn.matrix.kernels_plugin), its accuracy table
and its benchmark; written to results/<cell>/kernels.json (schema.KernelsFile), one list per step.

Standard library, torch and gdn only: the cell's image has no pydantic.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gdn import kernel_log
from gdn.kernel_log import KernelEntry, KernelLog
from gdn.matrix.jsonio import write_json
from gdn.matrix.schema import KERNELS_SCHEMA, KernelCount, Rejection

FILE = "kernels.json"
# the pytest option of gdn.matrix.kernels_plugin; here so that the entry names it without importing pytest
OPTION = "--gdn-kernels"


@contextlib.contextmanager
def recording(log: KernelLog | None = None) -> Iterator[KernelLog]:
    """Within the block, every op call and every dispatch inside a watched peer is noted in `log` (a new
    one by default), which the block gets."""
    from gdn.resolve import backends

    log = KernelLog() if log is None else log
    previous = kernel_log.install(log)
    try:
        with contextlib.ExitStack() as watched:
            for backend in backends().values():
                if backend.watch is not None:
                    watched.enter_context(backend.watch())
            yield log
    finally:
        kernel_log.install(previous)


def _order(entry: KernelEntry) -> tuple[str, ...]:
    return (entry.level, entry.function, entry.dtype, entry.during or "", entry.ran)


def kernel_counts(counts: Counter[KernelEntry]) -> list[KernelCount]:
    """Counts as kernels.json lists them, in a stable order."""
    return [
        KernelCount(
            level=e.level,
            function=e.function,
            dtype=e.dtype,
            ran=e.ran,
            calls=n,
            passed_over=[Rejection(backend=b, reason=r) for b, r in e.passed_over],
            during=e.during,
        )
        for e, n in sorted(counts.items(), key=lambda item: _order(item[0]))
    ]


def entries(records: list[dict[str, Any]]) -> Counter[KernelEntry]:
    """KernelCount dicts (as kernel_records gives them) back as counts."""
    counts: Counter[KernelEntry] = Counter()
    for r in records:
        passed_over = tuple((p["backend"], p["reason"]) for p in r["passed_over"])
        entry = KernelEntry(r["level"], r["function"], r["dtype"], r["ran"], passed_over, r.get("during"))
        counts[entry] += r["calls"]
    return counts


def kernel_records(counts: Counter[KernelEntry]) -> list[dict[str, Any]]:
    return [asdict(k) for k in kernel_counts(counts)]


def add_step(path: Path, step: str, counts: Counter[KernelEntry]) -> None:
    """Write `step`'s counts into the kernels file at `path`, keeping the other steps it holds (a file
    that does not read as one is replaced: the step's own record matters more than a broken one)."""
    steps: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        found = json.loads(path.read_text())
        steps = {k: v for k, v in found["steps"].items() if isinstance(v, list)}
    steps[step] = kernel_records(counts)
    write_json(path, {"schema": KERNELS_SCHEMA, "steps": steps})


def peer_text(counts: Counter[KernelEntry]) -> str:
    """What the peers' own dispatch ran among `counts` (the levels below gdn's), as one line:
    "gated_delta_rule.chunk_gated_delta_rule: flash_qla; common.chunk_bwd_dqkwg: tilelang"."""
    ran: dict[str, list[str]] = {}
    for entry in sorted(counts, key=_order):
        if entry.level != "gdn" and entry.ran not in ran.setdefault(entry.function, []):
            ran[entry.function].append(entry.ran)
    return "; ".join(f"{function}: {', '.join(names)}" for function, names in ran.items())
