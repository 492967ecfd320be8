"""Markdown for the matrix's texts (report.md, the speed and peer-kernel sections, diff output): one
place that knows how a value becomes a table cell, and how a text is kept within what a GitHub job
summary takes."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# GitHub refuses a job step's summary past 1 MiB; report.md and the diff stay under it with room left.
SUMMARY_MAX_BYTES = 1_000_000
# One table cell or list item: a reason, a message. The JSON beside keeps the whole text.
CELL_MAX_CHARS = 500
_FENCE = re.compile(r"^(`{3,})")


def cut(text: str, limit: int) -> str:
    """`text` of at most `limit` characters, an ellipsis saying where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def md_cell(value: Any, limit: int = CELL_MAX_CHARS) -> str:
    """A value as one Markdown table cell: no line breaks, pipes escaped, at most `limit` characters."""
    text = "—" if value is None or value == "" else str(value)
    return cut(" ".join(text.split()), limit).replace("|", "\\|")


def md_table(header: list[str], rows: Iterable[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


def fit_summary(text: str, whole: str, limit: int = SUMMARY_MAX_BYTES) -> str:
    """`text` whole when it fits in `limit` bytes; else cut at a line, with the code fence and the
    <details> blocks left open closed, and a last line saying how much was cut and that `whole` has it."""
    if len(text.encode()) <= limit:
        return text
    lines = text.splitlines()
    budget = limit - 1000  # the closers and the note
    kept: list[str] = []
    size, fence, details = 0, None, 0
    for line in lines:
        size += len(line.encode()) + 1
        if size > budget:
            break
        kept.append(line)
        opened = _FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            details += line.startswith("<details>") - line.startswith("</details>")
    closers = ([fence] if fence else []) + ["", "</details>"] * details
    note = (
        f"> {len(lines) - len(kept)} more lines are cut here: a GitHub job summary takes at most "
        f"{limit:,} bytes. The whole {whole}."
    )
    return "\n".join([*kept, *closers, "", note]) + "\n"
