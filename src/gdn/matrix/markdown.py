"""Markdown tables for the matrix's texts (report.md, the speed and peer-kernel sections, diff output):
one place that knows how a value becomes a table cell."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def md_cell(value: Any) -> str:
    """A value as one Markdown table cell: no line breaks, pipes escaped."""
    text = "—" if value is None or value == "" else str(value)
    return " ".join(text.split()).replace("|", "\\|")


def md_table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in rows]
    return [*lines, ""]
