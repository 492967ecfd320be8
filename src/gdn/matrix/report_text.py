"""The text of a report's parts that both its pages (report.md, report.html) and `gdn-matrix diff` show:
a benchmark row's label, an expectation's outcome, an interrupted run's failed tests, a failure's label. It reads the
report's cells and imports no builder or renderer, so each of them can use it."""

from __future__ import annotations

from typing import Any

from gdn.matrix.schema import Expectation, Failure

# the family of tests no family marker claims
UNMARKED_FAMILY = "unmarked"
# an interrupted run's failed tests named in its one-line reason
FAILED_SHOWN = 5


def failed_so_far(failed: list[str]) -> str:
    """The failed tests an interrupted run had finished (its `tests_failed`), the first few by name."""
    if not failed:
        return ""
    more = len(failed) - FAILED_SHOWN
    return f" (failed: {'; '.join(failed[:FAILED_SHOWN])}{f'; and {more} more' if more > 0 else ''})"


def label_word(label: str) -> str:
    """A failure's label as the pages write it: `seed-dependent`, `not rerun`."""
    return label.replace("_", "-" if label == "seed_dependent" else " ")


def label_text(failure: Failure) -> str:
    """`, flaky: passed on rerun 1 with its own seed; GDN_TEST_SEED=7`: what its reruns showed and the
    seed that replays it; empty for a report made before failures were labelled."""
    parts = []
    if failure.label is not None:
        label = label_word(failure.label)
        parts.append(f"{label}: {failure.label_reason}" if failure.label_reason else label)
    if failure.seed is not None:
        parts.append(f"GDN_TEST_SEED={failure.seed}")
    return "".join(f", {p}" if i == 0 else f"; {p}" for i, p in enumerate(parts))


def expectation_text(expect: Expectation) -> str:
    wanted = expect.backend + (f" ({expect.route})" if expect.route else "")
    if expect.actual_backend is None:
        return f"{expect.op}: expected {wanted}, nothing resolved"
    return f"{expect.op}: expected {wanted}, resolved {expect.actual_backend} ({expect.actual_route})"


def _shape_text(shape: Any) -> str:
    if isinstance(shape, (list, tuple)):
        return "×".join(str(s) for s in shape)
    if isinstance(shape, dict):
        return ", ".join(f"{k}={v}" for k, v in shape.items())
    return "" if shape is None else str(shape)


def bench_label(row: dict[str, Any]) -> str:
    backend = row.get("backend") or row.get("impl", "?")
    parts = [str(row.get("op", "?")), str(backend), _shape_text(row.get("shape")), str(row.get("pass") or "")]
    return " · ".join(p for p in parts if p)
