"""`gdn-matrix check`: "is my upgrade safe?" answered from the matrix's reports. It probes this
environment (the manifest, in process: its versions and gdn's resolution per op), finds the cells whose
stack matches it (the versions the report records for each cell, and its device kind) in the latest
report and, where none does, in the history's reports, newest first; with `--to PKG==VER` it does the
same for the stack the upgrade makes and compares its cells with this stack's as `gdn-matrix diff
--pair` does. Each
answer names the cell and the report (and its date) it comes from, and the history's last known good
report of that cell; a stack no cell covers gets the nearest cell and what differs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from gdn.matrix import diff, speed
from gdn.matrix.accuracy_report import worst
from gdn.matrix.check_answer import (
    EXIT_SAFE,
    THIS_ENVIRONMENT,
    CellAnswer,
    CheckAnswer,
    Difference,
    LastGood,
    Nearest,
    OpResolution,
    StackAnswer,
    render_text,
)
from gdn.matrix.config import MatrixConfigError, load_matrix
from gdn.matrix.devices import KINDS
from gdn.matrix.history_site import cell_histories, read_reports
from gdn.matrix.jsonio import REPORT_FILE_MAX_BYTES
from gdn.matrix.kernel_report import kernel_line, peer_dispatch
from gdn.matrix.report_parts import cell_primary_device, route_text
from gdn.matrix.schema import (
    REPORT_SCHEMA,
    AccuracyRow,
    BenchRow,
    Report,
    ReportCell,
    ResolutionEntry,
    shape_text,
)
from gdn.matrix.versions import SERIES_PINS, VERSION_KEYS, matches
from gdn.matrix.versions import versions as manifest_versions

EXIT_REGRESSES = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_COVERED = 3
EXIT_CODES = f"""exit status:
  {EXIT_SAFE}  a cell covers the stack (with --to: the target's stack) and it passed, with no regression
     against the cell of this environment's stack
  {EXIT_REGRESSES}  that cell failed (or did not pass), or the target cell regresses against this stack's
  {EXIT_BAD_INPUT}  unusable input: a report or history that does not validate, a --to that is not PKG==VERSION
     of a package the matrix records
  {EXIT_NOT_COVERED}  no cell of the reports covers the stack (this one, or with --to the target)"""
DEFAULT_REPORT = Path("matrix-report") / "report.json"  # where `gdn-matrix pull` puts it


class CheckError(ValueError):
    """Input `check` cannot use; the message names the argument or file and why."""


# ---------------------------------------------------------------- reading the inputs


@dataclass(frozen=True)
class Source:
    """A report to look in: `name` is its file or history entry, `generated_at` its date."""

    name: str
    report: Report

    @property
    def generated_at(self) -> str:
        return self.report.generated_at


def read_report(where: str) -> Source:
    """The report at a path (report.json, or the directory holding it) or an https URL, read and
    validated as `gdn-matrix diff` reads one."""
    if where.startswith(("http://", "https://")):
        if not where.startswith("https://"):
            raise CheckError(f"--report: expected a file or an https URL, got {where!r}")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "report.json"
            try:
                with urllib.request.urlopen(where, timeout=60) as response:
                    data = response.read(REPORT_FILE_MAX_BYTES + 1)
            except OSError as exc:
                raise CheckError(f"--report: cannot fetch {where}: {exc}") from None
            path.write_bytes(data)  # the cap is enforced by load_report, which reads it back
            return Source(where, _load(path))
    path = Path(where)
    return Source(where, _load(path / "report.json" if path.is_dir() else path))


def _load(path: Path) -> Report:
    try:
        return diff.load_report(path)
    except diff.ReportError as exc:
        raise CheckError(str(exc)) from None


def history_sources(history: Path) -> tuple[list[Source], dict[str, LastGood]]:
    """The history's readable reports, newest first, and each cell's last known good report."""
    if not history.is_dir():
        raise CheckError(f"--history: no history directory {history}")
    kept, _ = read_reports(history)  # an entry that no longer validates is the site's to list
    readable = [k for k in kept if k.report is not None]
    last_good = {}
    for cell in cell_histories(readable):
        if cell.last_good is not None:
            good = cell.last_good
            last_good[cell.name] = LastGood(good.generated_at, good.key, good.versions, good.lock)
    return [Source(k.key, k.report) for k in reversed(readable)], last_good


def parse_targets(values: list[str]) -> dict[str, str]:
    """`--to triton==3.6.0 --to flash-qla==0.1.3` as {version key: version}; parsed with packaging,
    never handed to an installer."""
    targets: dict[str, str] = {}
    for text in values:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise CheckError(f"--to: expected PKG==VERSION, got {text!r} ({exc})") from None
        specifiers = list(requirement.specifier)
        if len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
            raise CheckError(f"--to: expected one exact version (PKG==VERSION), got {text!r}")
        key = requirement.name.lower().replace("-", "_").replace(".", "_")
        if key not in VERSION_KEYS:
            raise CheckError(
                f"--to {text}: the matrix records no package {key!r}; expected one of {list(VERSION_KEYS)}"
            )
        if requirement.extras or requirement.marker or requirement.url:
            raise CheckError(f"--to: expected PKG==VERSION alone, got {text!r}")
        targets[key] = specifiers[0].version
    return targets


def environment_device(manifest: dict[str, Any]) -> str:
    """The device kind a cell of this environment would be: the first accelerator kind the manifest's
    devices section counts a card of, else cpu."""
    devices = manifest.get("devices")
    for kind in KINDS.values():
        section = devices.get(kind.torch_type) if isinstance(devices, dict) else None
        if kind.accelerator and isinstance(section, dict) and section.get("count"):
            return kind.name
    return "cpu"


def collect_environment() -> dict[str, Any]:
    from gdn.matrix.probe import collect_manifest

    with contextlib.redirect_stdout(sys.stderr):  # packages that print while importing
        return collect_manifest()


# ---------------------------------------------------------------- matching


def same_version(key: str, stack: str | None, cell: str | None) -> bool:
    """Whether a stack's version is the cell's: python and cuda by their series (3.12.x, 13.0.x),
    the others as releases (a local label is part of it: 2.11.0+cu130 is not 2.11.0+cpu); versions
    packaging cannot read match only themselves."""
    if stack is None or cell is None:
        return stack == cell
    try:
        if key in SERIES_PINS:
            return Version(stack).release[:2] == Version(cell).release[:2]
        return Version(stack) == Version(cell)
    except InvalidVersion:
        return stack == cell


def differences(stack: dict[str, str | None], device: str, cell: ReportCell) -> list[Difference]:
    """Where the stack differs from the cell, on the versions the report records for the cell."""
    found = [Difference("device", device, cell.device)] if cell.device != device else []
    found += [
        Difference(key, stack.get(key), value)
        for key, value in cell.versions.items()
        if not same_version(key, stack.get(key), value)
    ]
    return found


def _find(
    stack: dict[str, str | None], device: str, sources: list[Source]
) -> tuple[list[tuple[Source, ReportCell]], Nearest | None]:
    """The cells that cover the stack in the first source that has any, else the nearest cell of all
    (fewest differences, the newest report first)."""
    nearest: Nearest | None = None
    for source in sources:
        covering = []
        # a cell that recorded no versions never got to its probe (not run, build failed): it says
        # nothing of any stack
        for cell in (c for c in source.report.cells if any(c.versions.values())):
            found = differences(stack, device, cell)
            if not found:
                covering.append((source, cell))
            elif nearest is None or len(found) < len(nearest.differences):
                nearest = Nearest(cell.name, source.name, source.generated_at, found)
        if covering:
            return covering, None
    return [], nearest


def pinned_by(stack: dict[str, str | None], device: str, matrix: Path | None) -> list[str]:
    """matrix.yaml's cells whose pins this stack has (each pin as the cell runner compares it)."""
    if matrix is None:
        return []
    try:
        cells = load_matrix(matrix).cells
    except MatrixConfigError as exc:
        raise CheckError(f"--matrix: {exc}") from None
    found = []
    for cell in cells:
        pins = {key: value for key, value in cell.versions.model_dump().items() if value is not None}
        have = {key: stack.get("triton" if key == "triton_ascend" else key) for key in pins}
        if cell.device == device and all(
            have[key] is not None and matches(key, pin, have[key]) for key, pin in pins.items()
        ):
            found.append(cell.name)
    return found


# ---------------------------------------------------------------- answering


def _environment_cell(manifest: dict[str, Any], stack: dict[str, str | None], device: str) -> ReportCell:
    """This environment as a report's cell (what it resolves per op, its versions; it ran no tests), so
    that its resolution is compared with a cell's as `gdn-matrix diff` compares two cells'."""
    records = manifest.get("resolution")
    resolution: dict[str, dict[str, ResolutionEntry]] = {}
    for record in records if isinstance(records, list) else []:
        entry = ResolutionEntry(backend=record.get("backend"), route=record.get("route"), error=record.get("error"))
        resolution.setdefault(record["op"], {})[record["device"]] = entry
    return ReportCell(name=THIS_ENVIRONMENT, status="not_run", device=device, versions=stack, resolution=resolution)


def _compare(baseline: tuple[Source, ReportCell], answer: tuple[Source, ReportCell]) -> diff.ReportDiff:
    """`gdn-matrix diff --pair` from the baseline's cell to the answer's."""
    (old, old_cell), (new, new_cell) = baseline, answer
    return diff.diff_reports(old.report, new.report, pairs=[(old_cell.name, new_cell.name)])


def _resolution(
    cell: ReportCell, ops: list[str], baseline: ReportCell, compared: diff.ReportDiff
) -> list[OpResolution]:
    """Per op on the cell's device: what served it, and whether the baseline resolved it the same (a
    baseline that resolved nothing there, e.g. a probe whose resolution failed, resolved it otherwise)."""
    device = cell_primary_device(cell)
    changed = {(c.op, c.device): c for c in compared.backend_changes}
    rows = []
    for op in ops:
        served = route_text(cell.resolution.get(op, {}).get(device))
        change = changed.get((op, device))
        theirs = baseline.resolution.get(op, {}).get(device)
        if change is not None:
            rows.append(OpResolution(op, device, served, change.old_text, False))
        else:
            rows.append(OpResolution(op, device, served, route_text(theirs), theirs is not None))
    return rows


def _speed_line(row: BenchRow) -> str:
    return f"{row.op} {shape_text(row.shape)} {row.pass_} {row.backend} ({row.implementation or '?'}): {row.ms:.3g} ms"


def _cell_answer(
    found: tuple[Source, ReportCell], baseline: tuple[Source, ReportCell], last_good: dict[str, LastGood]
) -> tuple[CellAnswer, diff.ReportDiff]:
    """The answer of the cell, its resolution compared with the baseline's cell, and the comparison."""
    source, cell = found
    compared = _compare(baseline, found)
    answer = CellAnswer(
        cell=cell.name,
        report=source.name,
        generated_at=source.generated_at,
        device=cell.device,
        status=cell.status,
        reason=cell.reason,
        versions={k: v for k, v in cell.versions.items() if v is not None},
        families=cell.families,
        failures=cell.failures,
        resolution=_resolution(cell, source.report.ops, baseline[1], compared),
        peer_kernels=sorted({f"{step}: {kernel_line(k)}" for step, k in peer_dispatch(cell)}),
        speed=[_speed_line(row) for row in speed.cell_rows(cell) if row.ms is not None],
        accuracy=_accuracy_lines(cell.accuracy.rows if cell.accuracy else []),
        last_good=last_good.get(cell.name),
    )
    return answer, compared


def _accuracy_lines(rows: list[AccuracyRow]) -> list[str]:
    """The worst error against fp64 per (op, backend, dtype) over the cases, and where it was."""
    worst_of: dict[tuple[str, str, str], tuple[float, str]] = {}
    for row in rows:
        found = worst(row)
        if found is None:
            continue
        quantity, error = found
        value = math.inf if error is None else error
        case = " ".join(part for part in (row.regime, row.layout, quantity) if part)
        key = (row.op, row.backend, row.dtype)
        if key not in worst_of or value > worst_of[key][0]:
            worst_of[key] = (value, case)
    return [
        f"{op} {backend} {dtype}: {'not finite' if math.isinf(value) else f'{value:.3g}'} ({case})"
        for (op, backend, dtype), (value, case) in worst_of.items()
    ]


def check(
    manifest: dict[str, Any],
    sources: list[Source],
    *,
    targets: dict[str, str] | None = None,
    last_good: dict[str, LastGood] | None = None,
    matrix: Path | None = None,
) -> CheckAnswer:
    """The answer for this environment's manifest against the reports in `sources` (the latest first),
    and with `targets` for the stack they make."""
    last_good = last_good or {}
    device = environment_device(manifest)
    stack = manifest_versions(manifest)
    environment = Source(THIS_ENVIRONMENT, Report(REPORT_SCHEMA, str(manifest.get("generated_at")), [], []))
    environment.report.cells.append(_environment_cell(manifest, stack, device))
    baseline = (environment, environment.report.cells[0])
    here = StackAnswer(stack, device, pinned_by=pinned_by(stack, device, matrix))
    found, here.nearest = _find(stack, device, sources)
    here.covered = [_cell_answer(cell, baseline, last_good)[0] for cell in found]
    answer = CheckAnswer(here)
    if targets is None:
        _verdict_here(answer)
        return answer
    target_stack = {**stack, **targets}
    answer.target = StackAnswer(target_stack, device, pinned_by=pinned_by(target_stack, device, matrix))
    targeted, answer.target.nearest = _find(target_stack, device, sources)
    for target in targeted:
        # against this stack's cell of the same name where there is one (the same runtime and
        # families), else its first
        ours = next((cell for cell in found if cell[1].name == target[1].name), found[0] if found else None)
        cell_answer, compared = _cell_answer(target, ours or baseline, last_good)
        answer.target.covered.append(cell_answer)
        if ours is not None:
            answer.regressions += compared.regressions
    _verdict_target(answer)
    return answer


def _not_passed(cells: list[CellAnswer]) -> str:
    return ", ".join(f"{cell.cell} {cell.status}" for cell in cells if cell.status != "passed")


def _verdict_here(answer: CheckAnswer) -> None:
    covered = answer.here.covered
    if not covered:
        answer.verdict, answer.exit_code = "no cell covers this stack", EXIT_NOT_COVERED
    elif _not_passed(covered):
        answer.verdict, answer.exit_code = f"this stack's cell did not pass: {_not_passed(covered)}", EXIT_REGRESSES
    else:
        answer.verdict, answer.exit_code = "covered: this stack's cell passed", EXIT_SAFE


def _verdict_target(answer: CheckAnswer) -> None:
    covered = answer.target.covered if answer.target else []
    if not covered:
        answer.verdict, answer.exit_code = "no cell covers the target stack", EXIT_NOT_COVERED
    elif _not_passed(covered):
        answer.verdict, answer.exit_code = f"the target's cell did not pass: {_not_passed(covered)}", EXIT_REGRESSES
    elif answer.regressions:
        answer.verdict, answer.exit_code = "the target's cell regresses against this stack's", EXIT_REGRESSES
    elif not answer.here.covered:
        answer.verdict = "the target's cell passed; no cell covers this stack to compare it with"
        answer.exit_code = EXIT_SAFE
    else:
        answer.verdict, answer.exit_code = "safe: the target's cell passed with no regression", EXIT_SAFE


# ---------------------------------------------------------------- gdn-matrix check


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--report",
        metavar="URL_OR_FILE",
        help=f"the latest report: report.json, its directory or an https URL (default: {DEFAULT_REPORT}, "
        "where `gdn-matrix pull` puts it, when it exists)",
    )
    parser.add_argument("--history", type=Path, metavar="DIR", help="a history directory (`gdn-matrix history add`)")
    parser.add_argument(
        "--to",
        action="append",
        default=[],
        metavar="PKG==VER",
        help="the upgrade to check (repeatable), e.g. --to triton==3.6.0",
    )
    parser.add_argument("--matrix", type=Path, metavar="FILE", help="also name matrix.yaml's cells that pin each stack")
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")


def _sources(args: argparse.Namespace) -> tuple[list[Source], dict[str, LastGood]]:
    sources: list[Source] = []
    if args.report is not None:
        sources.append(read_report(args.report))
    elif DEFAULT_REPORT.is_file():
        sources.append(read_report(str(DEFAULT_REPORT)))
    last_good: dict[str, LastGood] = {}
    if args.history is not None:
        kept, last_good = history_sources(args.history)
        sources += kept
    if not sources:
        raise CheckError(
            f"no report to check against: give --report or --history (or `gdn-matrix pull` to {DEFAULT_REPORT})"
        )
    return sources, last_good


def run(args: argparse.Namespace) -> int:
    try:
        targets = parse_targets(args.to) if args.to else None
        sources, last_good = _sources(args)
        answer = check(collect_environment(), sources, targets=targets, last_good=last_good, matrix=args.matrix)
    except CheckError as exc:
        print(f"gdn-matrix check: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(asdict(answer), indent=2) if args.json else render_text(answer))
    return answer.exit_code
