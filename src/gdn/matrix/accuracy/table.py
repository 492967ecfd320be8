"""The accuracy rows as text (torch-free: the report renders them too)."""

from __future__ import annotations

from gdn.matrix.schema import AccuracyRow

NOT_FINITE = "not finite"


def error_text(value: float | None) -> str:
    return NOT_FINITE if value is None else f"{value:.1e}"


def worst(row: AccuracyRow) -> tuple[str, float | None] | None:
    """The quantity furthest off (a non-finite one first), or None for a row without errors."""
    if not row.errors:
        return None
    return max(row.errors.items(), key=lambda item: float("inf") if item[1] is None else item[1])


def case_text(row: AccuracyRow) -> str:
    return " ".join(part for part in (row.dtype, row.regime, row.layout) if part)


def outcome_text(row: AccuracyRow) -> str:
    """The row's errors, the worst first and marked, or why it has none."""
    found = worst(row)
    if found is None:
        return f"{row.status}: {row.reason}" if row.reason else row.status
    name, value = found
    rest = [f"{q} {error_text(v)}" for q, v in row.errors.items() if q != name]
    return ", ".join([f"worst {name} {error_text(value)}", *rest])


def kernels_text(row: AccuracyRow) -> str:
    """What the row's calls ran inside the peers (the dispatch below gdn's own choice)."""
    return "; ".join(f"{k.function}: {k.ran}" for k in row.kernels if k.level != "gdn")


def lines(rows: list[AccuracyRow]) -> list[str]:
    header = ["op", "backend", "case", "errors (||out - ref|| / ||ref||, fp64 reference)", "peer kernels"]
    body = [[r.op, r.route or r.backend, case_text(r), outcome_text(r), kernels_text(r) or "—"] for r in rows]
    return [" | ".join(header), *(" | ".join(cells) for cells in body)]
