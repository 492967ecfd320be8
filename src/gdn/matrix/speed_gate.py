"""Which benchmark rows of a new report are slower, judged by the history when it has enough of them.

With a history (`gdn-matrix diff --history DIR`), each row of a cell is held against the trailing
median of that row over the last WINDOW reports kept before the new one, and against that median's
spread: a row is slower when

    new_ms > median * (1 + max(threshold, SPREAD_K * MAD / median))

MAD being the median absolute deviation of those times. A row with fewer than MIN_REPORTS times in the
history, and every row without a history, is judged as before, against the old report alone, and each
slowdown names the rule that judged it. One run's timing carries its machine's noise (a neighbour's
load, a clock boost); the median of several runs does not move with one of them, and the spread
widens the margin of a row as noisy as its history shows, so a noisy row does not gate on noise.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from gdn.matrix.history_store import generated_time, read_entries, read_report
from gdn.matrix.schema import Report, SchemaError
from gdn.matrix.speed import bench_index

# at least this many timings of a row make a median worth more than the old report's one
MIN_REPORTS = 5
# the last reports of the history a median is taken over: two weeks of daily runs, recent enough that
# a deliberate change of speed (a new kernel) soon becomes the baseline
WINDOW = 14
# how many MADs above the median a time may be before it is slower: about two standard deviations of a
# normal spread (MAD ~ 0.67 sigma), past what a run of a quiet machine shows
SPREAD_K = 3.0


@dataclass(frozen=True)
class Judged:
    """A row's baseline and the rule that gave it; `allowed` is the fraction above it that is not slower;
    `by_history` whether the baseline is the history's trailing median (else the old report's time)."""

    baseline_ms: float
    allowed: float
    rule: str
    by_history: bool = False


def trailing_reports(history: Path, before: str) -> tuple[list[Report], list[str]]:
    """The history's reports generated before `before` (the new report's generated_at), oldest first,
    at most WINDOW of them, and a line for each entry that could not be read."""
    entries, problems = read_entries(history)
    limit = generated_time(before)
    reports = []
    for stored in entries:
        if stored.generated >= limit:
            continue
        try:
            reports.append(read_report(stored))
        except SchemaError as exc:
            problems.append(f"{stored.entry.key}: {exc}")
    return reports[-WINDOW:], problems


def trailing_times(reports: list[Report], cell: str) -> dict[str, list[float]]:
    """Per benchmark row of `cell` (bench_index's key), its times in `reports`, oldest first."""
    times: dict[str, list[float]] = {}
    for report in reports:
        found = next((c for c in report.cells if c.name == cell), None)
        for key, (_, ms) in (bench_index(found) if found else {}).items():
            times.setdefault(key, []).append(ms)
    return times


def judge(old_ms: float | None, history: list[float] | None, threshold: float) -> Judged | None:
    """The baseline of a row: the trailing median where the history has MIN_REPORTS times of it, else
    the old report's time; None when neither has one."""
    if history is not None and len(history) >= MIN_REPORTS:
        median = statistics.median(history)
        spread = statistics.median(abs(ms - median) for ms in history)
        allowed = max(threshold, SPREAD_K * spread / median)
        rule = f"median of {len(history)} reports (MAD {spread:.3g} ms)"
        return Judged(median, allowed, rule, by_history=True)
    if old_ms is None:
        return None
    if history is None:
        return Judged(old_ms, threshold, "old report")
    return Judged(old_ms, threshold, f"old report (history has {len(history)} of {MIN_REPORTS} reports)")
