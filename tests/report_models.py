"""Reports the tests write as plain JSON data, read as gdn-matrix diff reads a report.json: the typed
model (gdn.matrix.schema.Report), validated strictly."""

from __future__ import annotations

import json
from typing import Any

from gdn.matrix import diff, schema


def typed(report: dict[str, Any]) -> schema.Report:
    return schema.load(schema.Report, json.dumps(report, allow_nan=False), "report.json")


def diff_typed(old: dict[str, Any], new: dict[str, Any], **options: Any) -> diff.ReportDiff:
    """diff.diff_reports of the two reports' models."""
    return diff.diff_reports(typed(old), typed(new), **options)


def typed_cell(cell: dict[str, Any]) -> schema.ReportCell:
    return schema.load(schema.ReportCell, json.dumps(cell, allow_nan=False), "report.json cell")


def typed_entry(entry: dict[str, Any]) -> schema.ResolutionEntry:
    return schema.load(schema.ResolutionEntry, json.dumps(entry, allow_nan=False), "report.json resolution")
