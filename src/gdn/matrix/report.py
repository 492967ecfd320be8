"""Merge every results/<cell>/ into one matrix report: report.json (the source of truth, versioned
schema), report.md (sized for a GitHub job summary) and report.html (one self-contained page).

The report is built by gdn.matrix.report_build (which says how a cell's status is judged) and rendered
from report.json's model by gdn.matrix.report_markdown and gdn.matrix.report_html; this module writes
the three files and is the `gdn-matrix report` command. report.json is strict JSON; report.md stays
within what a GitHub job summary takes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gdn.matrix import schema
from gdn.matrix.config import Matrix, MatrixConfigError, default_matrix_path, load_matrix
from gdn.matrix.jsonio import atomic_write
from gdn.matrix.report_build import build_report
from gdn.matrix.report_html import render_html
from gdn.matrix.report_markdown import render_markdown
from gdn.matrix.schema import Report


def write_report(report: Report, out_dir: Path) -> dict[str, Path]:
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "html": out_dir / "report.html"}
    # render everything before writing anything, so a rendering bug cannot leave a mixed set; the
    # pages are rendered from report.json's model as diff reads it, so that diff can read every
    # report this writes; strict JSON: every number in it was read from a file that had to be too
    text = json.dumps(report.to_json(), indent=2, allow_nan=False) + "\n"
    model = schema.load(schema.Report, text, "report.json")
    markdown, html = render_markdown(model), render_html(model)
    atomic_write(paths["json"], text)
    atomic_write(paths["md"], markdown)
    atomic_write(paths["html"], html)
    return paths


# ---------------------------------------------------------------- gdn-matrix report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=Path("results"), help="results root (default: results)")
    parser.add_argument(
        "--matrix", type=Path, help="matrix.yaml naming the cells (default: $GDN_MATRIX, else ./matrix.yaml if present)"
    )
    parser.add_argument(
        "--output", type=Path, metavar="DIR", help="where to write the report (default: the results root's report/)"
    )


def _matrix(path: Path | None) -> Matrix | None:
    if path is None:
        path = default_matrix_path()
        if not path.exists():
            return None
    return load_matrix(path)


def run(args: argparse.Namespace) -> int:
    try:
        matrix = _matrix(args.matrix)
    except MatrixConfigError as exc:
        print(f"gdn-matrix report: error: {exc}", file=sys.stderr)
        return 2
    try:
        report = build_report(args.results, matrix)
    except FileNotFoundError as exc:
        print(f"gdn-matrix report: error: {exc}", file=sys.stderr)
        return 2
    paths = write_report(report, args.output or args.results / "report")
    for path in paths.values():
        print(path)
    return 0
