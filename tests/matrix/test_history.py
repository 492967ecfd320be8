"""`gdn-matrix history`: keeping reports (add, the same report once, a bad report refused, retention) and
the site rendered from the three reports under tests/data/history/, which are real runs of the local
cell on a CPU under Triton 3.2, 3.6 and 3.9 (bench/history_reports.sh), checked in headless Chromium."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from browser import chromium, headless
from gdn.matrix import cli, schema
from gdn.matrix import history_store as history
from gdn.matrix.history_site import write_site
from repo_paths import TESTS

pytestmark = pytest.mark.tooling

DATA = TESTS / "data" / "history"
TRITONS = ("3.2.0", "3.6.0", "3.9.0")


@pytest.fixture
def results(tmp_path) -> dict[str, Path]:
    """A copy of each kept run's results root (report/ and local/), by Triton version."""
    roots = {}
    for version in TRITONS:
        roots[version] = tmp_path / f"results-{version}"
        shutil.copytree(DATA / f"triton-{version}", roots[version])
    return roots


def _add(report_dir: Path, history_dir: Path, *more: str) -> int:
    return cli.main(["history", "add", str(report_dir), "--history", str(history_dir), *more])


def _entries(history_dir: Path) -> list[str]:
    return [s.entry.key for s in history.read_entries(history_dir)[0]]


def test_add_keeps_the_report_and_its_cells_small_files_not_their_logs(results, tmp_path, capsys):
    root = results["3.9.0"]
    (root / "local" / "log.txt").write_text("a log line\n" * 1000)
    store = tmp_path / "history"
    assert _add(root / "report", store) == 0
    [key] = _entries(store)
    assert capsys.readouterr().out == f"kept as {store / key}\n"
    entry, _ = schema.load_file(schema.HistoryEntry, store / key / "entry.json")
    report = json.loads((root / "report" / "report.json").read_text())
    assert entry.generated_at == report["generated_at"]
    assert key.startswith(re.sub(r"[-:]", "", report["generated_at"])[:15] + "Z-")
    assert entry.cells == ["local"]
    kept = {f.path for f in entry.files}
    assert "report.json" in kept
    assert {"cells/local/cell.json", "cells/local/manifest.json", "cells/local/kernels.json"} <= kept
    assert "cells/local/log.txt" not in kept and not (store / key / "cells" / "local" / "log.txt").exists()
    for f in entry.files:
        assert (store / key / f.path).stat().st_size == f.bytes
    assert (store / key / "report.json").read_bytes() == (root / "report" / "report.json").read_bytes()


def test_adding_the_same_report_twice_is_one_entry(results, tmp_path, capsys):
    store = tmp_path / "history"
    assert _add(results["3.2.0"] / "report", store) == 0
    assert _add(results["3.2.0"] / "report", store) == 0
    [key] = _entries(store)
    assert capsys.readouterr().out.splitlines()[-1] == f"already kept as {store / key}"
    # another report of the same cell is another entry
    assert _add(results["3.6.0"] / "report", store) == 0
    assert len(_entries(store)) == 2


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: {**r, "cells": 5}, "report.json: cells: Input should be a valid array"),
        (lambda r: {**r, "generated_at": "yesterday"}, "generated_at: expected an ISO 8601 time, got 'yesterday'"),
        (lambda r: {k: v for k, v in r.items() if k != "ops"}, "report.json: ops: Field required"),
    ],
    ids=["wrong type", "not a time", "missing field"],
)
def test_a_report_that_does_not_validate_is_refused(results, tmp_path, capsys, edit, message):
    path = results["3.9.0"] / "report" / "report.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    store = tmp_path / "history"
    assert _add(path.parent, store) == 2
    err = capsys.readouterr().err
    assert err.startswith("gdn-matrix history add: error: ") and message in err
    assert _entries(store) == []


def test_a_directory_without_a_report_is_refused(tmp_path, capsys):
    assert _add(tmp_path, tmp_path / "history") == 2
    assert f"{tmp_path}: no report.json" in capsys.readouterr().err


def test_a_cell_name_from_the_report_never_becomes_a_path_out_of_the_results(results, tmp_path):
    root = results["3.9.0"]
    path = root / "report" / "report.json"
    report = json.loads(path.read_text())
    report["cells"][0]["name"] = "../outside"
    path.write_text(json.dumps(report))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "cell.json").write_text("{}")
    store = tmp_path / "history"
    assert _add(root / "report", store) == 0
    entry = history.read_entries(store)[0][0].entry
    assert [f.path for f in entry.files] == ["report.json"]
    assert entry.left_out == ["'../outside' (not a cell name: its files are not looked for)"]


def _report(version: str) -> dict:
    return json.loads((DATA / f"triton-{version}" / "report" / "report.json").read_text())


def _by_time() -> list[str]:
    """The Triton versions in the order their reports were generated."""
    return sorted(TRITONS, key=lambda v: history.generated_time(_report(v)["generated_at"]))


def test_retention_prunes_the_oldest_reports_first(results, tmp_path, capsys):
    store = tmp_path / "history"
    order, keys = _by_time(), []
    for version in order:
        assert _add(results[version] / "report", store, "--keep", "2") == 0
        keys.append(_entries(store)[-1])
    out = capsys.readouterr().out
    assert f"pruned {store / keys[0]} (past the bounds: --keep 2, --max-mb {history.MAX_MB})" in out
    assert _entries(store) == keys[1:]
    # pruning goes by the reports' generated time, not by when they were added: the oldest report,
    # added again to a full history, is the one pruned
    assert _add(results[order[0]] / "report", store, "--keep", "2") == 0
    assert capsys.readouterr().out.splitlines() == [
        f"kept as {store / keys[0]}",
        f"pruned {store / keys[0]} (past the bounds: --keep 2, --max-mb {history.MAX_MB})",
    ]
    assert _entries(store) == keys[1:]

    # the size bound: room for the newest report alone
    newest = history.read_entries(store)[0][-1].entry
    assert history.prune(store, keep=10, max_bytes=newest.total_bytes) == [keys[1]]
    assert _entries(store) == [keys[2]]


def test_a_report_larger_than_the_size_bound_is_refused(results, tmp_path, capsys):
    (results["3.9.0"] / "local" / "junit.xml").write_bytes(b"<testsuites/>" + b" " * (1 << 20))
    assert _add(results["3.9.0"] / "report", tmp_path / "history", "--max-mb", "1") == 2
    assert "more than the history's bound (1048576 bytes)" in capsys.readouterr().err


@pytest.fixture
def site(results, tmp_path) -> Path:
    store = tmp_path / "history"
    for version in TRITONS:
        assert _add(results[version] / "report", store) == 0
    out = tmp_path / "site"
    assert cli.main(["history", "render", "--history", str(store), "--out", str(out)]) == 0
    return out / "index.html"


def test_the_site_shows_each_cell_over_the_three_reports(site):
    page = site.read_text()
    assert "http" not in page and "<script" not in page
    assert page.count('<section class="cell') == 1 and 'id="cell-local"' in page
    timeline = page[page.index('id="status-timeline"') : page.index("</table>", page.index('id="status-timeline"'))]
    assert timeline.count('<td class="s-') == 3
    # the Triton changes between consecutive reports, as the probe's manifests recorded them
    tritons = [_report(v)["cells"][0]["versions"]["triton"] for v in _by_time()]
    assert sorted(tritons) == list(TRITONS)  # each report ran under the Triton it was made for
    for old, new in itertools.pairwise(tritons):
        assert f"triton: {old} -&gt; {new}" in page
    # one resolved route per op and report, an accuracy plot per measured row
    assert page.count("triton:bundled(interpreter)") >= 3 * 7
    assert page.count('<svg class="series"') >= 10
    assert "Last known good stack" in page


def _png_pixels(png: bytes) -> tuple[int, int, bytes]:
    """Width, height and the decompressed scanlines of a PNG (standard library only)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    at, data, size = 8, b"", (0, 0)
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            data += body
        at += 12 + length
    return size[0], size[1], zlib.decompress(data)


def test_the_site_renders_in_headless_chromium(site, tmp_path):
    browser = chromium()
    dom = headless(browser, tmp_path / "profile", "--dump-dom", site.as_uri())
    assert dom.returncode == 0, dom.stderr
    for name in {c["name"] for v in TRITONS for c in _report(v)["cells"]}:
        assert f'id="cell-{name}"' in dom.stdout
        assert f'<a href="#cell-{name}">{name}</a>' in dom.stdout
    png = tmp_path / "history.png"
    shot = headless(browser, tmp_path / "profile", f"--screenshot={png}", "--window-size=1400,2400", site.as_uri())
    assert shot.returncode == 0, shot.stderr
    width, height, pixels = _png_pixels(png.read_bytes())
    assert (width, height) == (1400, 2400)
    # a blank page is one colour: its scanlines hold a handful of byte values; text, badges and plots many
    assert len(set(pixels)) > 64


def test_render_of_a_history_that_does_not_exist_is_refused(tmp_path, capsys):
    missing = tmp_path / "nothing"
    assert cli.main(["history", "render", "--history", str(missing), "--out", str(tmp_path / "site")]) == 2
    assert f"no history directory {missing}" in capsys.readouterr().err
    assert not (tmp_path / "site").exists()


def test_an_entry_that_no_longer_reads_is_named_on_the_page_and_never_pruned(results, tmp_path):
    store = tmp_path / "history"
    assert _add(results["3.9.0"] / "report", store) == 0
    broken = store / "20200101T000000Z-000000000000"
    broken.mkdir()
    (broken / "entry.json").write_text('{"key": 5}')
    [kept] = _entries(store)
    (store / kept / "report.json").write_text('{"schema": 1}')
    page = write_site(store, tmp_path / "site").read_text()
    assert f"{broken.name}: not a history entry: entry.json: key: Input should be a valid string" in page
    assert f"{kept}: report.json: generated_at: Field required" in page
    assert history.prune(store, keep=1, max_bytes=1) == [kept]
    assert broken.is_dir()
