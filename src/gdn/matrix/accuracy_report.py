"""The accuracy table as the report shows it and the diff gates it: each cell's accuracy.json rows
(every backend's error per op, dtype, gate regime, layout and quantity against fp64 references), the
worst quantity of each row marked, a plot for report.html, and the regressions between two reports.

An error regresses when it grows past `factor` times its old value (default 2) and past a floor per
dtype, below which a change is rounding, not a finding; an error that becomes non-finite, and a row that
was measured and no longer is, regress too. Each regression names op, backend, dtype, regime, layout and
quantity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gdn.matrix.accuracy.table import case_text, error_text, outcome_text
from gdn.matrix.markdown import md_cell, md_table
from gdn.matrix.schema import AccuracyFile

DEFAULT_FACTOR = 2.0
# errors under these are rounding whatever their ratio: fp32 kernels sit at 1e-7-1e-6, bf16 at 1e-3-5e-3
FLOORS = {"float32": 1e-5, "bfloat16": 5e-3, "float16": 5e-3}


def cell_accuracy(found: AccuracyFile | None) -> dict[str, Any] | None:
    """The report's `accuracy` of a cell."""
    if found is None:
        return None
    rows = [
        {
            "op": r.op,
            "backend": r.backend,
            "route": r.route,
            "dtype": r.dtype,
            "regime": r.regime,
            "layout": r.layout,
            "status": r.status,
            "errors": dict(r.errors),
            "reason": r.reason,
            "peer_kernels": sorted({f"{k.function}: {k.ran}" for k in r.kernels if k.level != "gdn"}),
        }
        for r in found.rows
    ]
    return {"device": found.device, "shape": dict(found.shape), "rows": rows, "unavailable": dict(found.unavailable)}


def _row_key(row: dict[str, Any]) -> tuple[str, str, str, str | None, str | None]:
    return (row["op"], row["backend"], row["dtype"], row["regime"], row["layout"])


def _as_row(row: dict[str, Any]) -> Any:
    from gdn.matrix.schema import AccuracyRow

    return AccuracyRow(
        op=row["op"],
        backend=row["backend"],
        dtype=row["dtype"],
        status=row["status"],
        regime=row["regime"],
        layout=row["layout"],
        route=row["route"],
        errors=row["errors"],
        reason=row["reason"],
    )


def worst(row: dict[str, Any]) -> tuple[str, float | None] | None:
    if not row["errors"]:
        return None
    return max(row["errors"].items(), key=lambda item: math.inf if item[1] is None else item[1])


# ---------------------------------------------------------------- report.md and report.html


def markdown(cells: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for cell in cells:
        found = cell.get("accuracy")
        if not found:
            continue
        shape = " ".join(f"{k}={v}" for k, v in found["shape"].items())
        rows = [
            [
                r["op"],
                md_cell(r["route"] or r["backend"]),
                case_text(_as_row(r)),
                md_cell(_marked(r)),
                md_cell(", ".join(r["peer_kernels"]) or "—"),
            ]
            for r in found["rows"]
        ]
        lines += [f"### Accuracy: {cell['name']} ({found['device']}, {shape})", ""]
        lines += [*md_table(["op", "backend", "case", "||out - ref|| / ||ref|| (worst in bold)", "peer kernels"], rows)]
        lines += [f"- {name}: not measured here: {md_cell(why)}" for name, why in found["unavailable"].items()]
        lines.append("")
    return ["## Accuracy (against fp64 references)", "", *lines] if lines else []


def _marked(row: dict[str, Any]) -> str:
    found = worst(row)
    if found is None:
        return outcome_text(_as_row(row))
    name, _ = found
    texts = {q: f"{q} {error_text(e)}" for q, e in row["errors"].items()}
    return ", ".join(f"**{text}**" if q == name else text for q, text in texts.items())


@dataclass(frozen=True)
class Bar:
    """One row's worst error, as report.html plots it (log scale, 1e-8 .. 1)."""

    label: str
    value: float | None  # None: not finite
    width: float  # 0 .. 1 of the plot's width

    @property
    def text(self) -> str:
        return error_text(self.value)


LOG_MIN, LOG_MAX = -8.0, 0.0


def bars(cell: dict[str, Any]) -> list[Bar]:
    found = []
    for row in (cell.get("accuracy") or {}).get("rows", []):
        top = worst(row)
        if top is None:
            continue
        name, value = top
        label = f"{row['op']} · {row['backend']} · {case_text(_as_row(row))} · {name}"
        if value is None:
            width = 1.0
        else:
            width = (min(max(math.log10(max(value, 1e-300)), LOG_MIN), LOG_MAX) - LOG_MIN) / (LOG_MAX - LOG_MIN)
        found.append(Bar(label, value, width))
    return found


# ---------------------------------------------------------------- diff


@dataclass
class AccuracyRegression:
    cell: str
    op: str
    backend: str
    dtype: str
    regime: str | None
    layout: str | None
    quantity: str | None
    old: float | None
    new: float | None
    why: str

    def text(self) -> str:
        case = " ".join(p for p in (self.dtype, self.regime, self.layout) if p)
        what = f"{self.op} · {self.backend} · {case}" + (f" · {self.quantity}" if self.quantity else "")
        return f"{self.cell}: {what}: {self.why}"


def regressions(name: str, old: dict[str, Any], new: dict[str, Any], factor: float) -> list[AccuracyRegression]:
    """The errors of `new` that grew past `factor` times `old`'s and past the dtype's floor, became
    non-finite, or are no longer measured."""
    before = {_row_key(r): r for r in (old.get("accuracy") or {}).get("rows", [])}
    found = []
    for row in (new.get("accuracy") or {}).get("rows", []):
        previous = before.get(_row_key(row))
        if previous is None or previous["status"] != "measured":
            continue
        base = (name, row["op"], row["backend"], row["dtype"], row["regime"], row["layout"])
        if row["status"] != "measured":
            why = f"no longer measured ({row['status']}: {row['reason']})"
            found.append(AccuracyRegression(*base, None, None, None, why))
            continue
        floor = FLOORS.get(row["dtype"], 0.0)
        for quantity, was in previous["errors"].items():
            if quantity not in row["errors"]:
                continue
            now = row["errors"][quantity]
            if was is None:
                continue  # it was not finite before: no growth to measure
            if now is None:
                found.append(AccuracyRegression(*base, quantity, was, None, f"{error_text(was)} → not finite"))
            elif now > floor and now > factor * was:
                ratio = now / was if was > 0 else math.inf
                why = f"{error_text(was)} → {error_text(now)} ({ratio:.3g}x, over {factor:g}x and the floor {floor:g})"
                found.append(AccuracyRegression(*base, quantity, was, now, why))
    return found


def regression_rows(items: list[AccuracyRegression]) -> list[list[str]]:
    return [
        [r.cell, r.op, r.backend, r.dtype, r.regime or "—", r.layout or "—", r.quantity or "—", r.why] for r in items
    ]


REGRESSION_COLUMNS = ["cell", "op", "backend", "dtype", "regime", "layout", "quantity", "error"]


def regression_markdown(items: list[AccuracyRegression]) -> list[str]:
    return md_table(REGRESSION_COLUMNS, regression_rows(items)) if items else []
