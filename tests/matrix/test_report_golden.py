"""The report and the diff, byte for byte, on the sample results in docs/samples: report.json, report.md
and report.html built from each sample's results/, and the diff of the two built reports, equal what
tests/data/report_golden holds. A change of the report's code that changes what it writes shows here,
file by file; one that means to change it rewrites the golden files with GDN_WRITE_GOLDEN=1 and shows
the difference in its commit."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gdn.matrix import diff
from gdn.matrix.report import write_report
from gdn.matrix.report_build import build_report
from repo_paths import ROOT, TESTS

pytestmark = pytest.mark.tooling

SAMPLES = ROOT / "docs" / "samples"
GOLDEN = TESTS / "data" / "report_golden"
OLD, NEW = "h200-cuda-triton36-2026-12-01", "h200-cuda-flashqla-2026-12-02"
GENERATED_AT = "2026-12-04T00:00:00+00:00"
FILES = ("report.json", "report.md", "report.html")


def _same_as_golden(path: Path, golden: Path) -> None:
    text = path.read_text(encoding="utf-8")
    if os.environ.get("GDN_WRITE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), f"{path.name} differs from {golden}"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Each sample's report, built from a copy of its results (building may record a dead run there),
    with its time of generation pinned."""
    root = tmp_path_factory.mktemp("golden")
    out = {}
    for sample in (OLD, NEW):
        results = root / sample / "results"
        shutil.copytree(SAMPLES / sample / "results", results)
        report = build_report(results)
        report.generated_at = GENERATED_AT
        out[sample] = write_report(report, root / sample / "report")["json"].parent
    return out


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("sample", [OLD, NEW])
def test_the_sample_reports_are_unchanged(built, sample, name):
    _same_as_golden(built[sample] / name, GOLDEN / sample / name)


def test_the_sample_diff_is_unchanged(built, tmp_path, capsys):
    pair = ["--pair", "cuda-triton36=cuda-flashqla"]
    code = diff.main([str(built[OLD] / "report.json"), str(built[NEW] / "report.json"), *pair])
    (tmp_path / "diff.md").write_text(capsys.readouterr().out + f"\nexit status {code}\n", encoding="utf-8")
    _same_as_golden(tmp_path / "diff.md", GOLDEN / "diff-cuda-triton36-to-cuda-flashqla.md")
