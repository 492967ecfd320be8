"""`gdn-matrix bisect`: the search over package sets, with a pure function standing in for the
environments (which set of packages passes, fails or does not hold together), and the real composition
of hashed requirement files from two small locks. The uv environments themselves need PyPI and
torch's wheel: bench/bisect_cpu.sh runs them, and its output is kept under bench/results/."""

from __future__ import annotations

import json
import os
import shutil
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

import pytest

from gdn.matrix import bisect, bisect_env
from gdn.matrix.bisect_env import BisectInputError, requirements_text, unmet_requirements
from gdn.matrix.bisect_search import Search, Trial, compose, differences
from gdn.matrix.lockfile import parse_body, parse_lock, render_header
from gdn.matrix.schema import BisectResult, PackageChange, load
from repo_paths import ROOT

pytestmark = pytest.mark.tooling


def _search(good: Mapping[str, str], bad: Mapping[str, str], verdict) -> tuple[BisectResult, list[str]]:
    lines: list[str] = []
    result = Search(good, bad, verdict, echo=lines.append).run("cpu", "good.txt", "bad.txt", ["t.py::test"])
    return result, lines


GOOD = {f"pkg-{i:02d}": "1.0" for i in range(16)}
BAD = {f"pkg-{i:02d}": "2.0" for i in range(16)}


@pytest.mark.parametrize("culprit", sorted(BAD))
def test_the_one_package_that_flips_is_named_in_log2_steps(culprit):
    result, lines = _search(GOOD, BAD, lambda packages: Trial("fail" if packages[culprit] == "2.0" else "pass"))
    assert result.verdict == "found"
    assert result.culprit == [PackageChange(culprit, "1.0", "2.0")]
    # both ends, then 4 halvings of 16
    assert len(result.steps) == 2 + 4
    assert [s.outcome for s in result.steps[:2]] == ["fail", "pass"]
    assert lines[0].startswith("step 1: the bad lock whole -> fail")
    assert lines[1].startswith("step 2: the good lock alone -> pass")


def test_added_and_removed_packages_are_changes_too():
    good = {"keep": "1", "gone": "1", "moved": "1"}
    bad = {"keep": "1", "moved": "2", "new": "3"}
    changes = differences(good, bad)
    assert changes == [
        PackageChange("gone", "1", None),
        PackageChange("moved", "1", "2"),
        PackageChange("new", None, "3"),
    ]
    assert compose(good, changes) == bad
    assert compose(good, [changes[0], changes[2]]) == {"keep": "1", "moved": "1", "new": "3"}
    # a removal that breaks the tests is found as one
    result, _ = _search(good, bad, lambda packages: Trial("fail" if "gone" not in packages else "pass"))
    assert [c.describe() for c in result.culprit] == ["gone 1 (removed)"]


def _needs(requirer: str, required: str, culprit: str):
    """An environment where `requirer` at the bad version needs `required` at the bad version too (uv's
    check names the pair), and `culprit` at the bad version fails the tests."""

    def verdict(packages: Mapping[str, str]) -> Trial:
        if packages[requirer] == "2.0" and packages[required] != "2.0":
            return Trial("broken", "unmet", ((requirer, required),))
        return Trial("fail" if packages[culprit] == "2.0" else "pass")

    return verdict


def test_a_change_that_needs_another_is_changed_with_it_and_reported_as_a_group():
    # pkg-03 needs pkg-12, which comes after it: a prefix with pkg-03 alone does not install
    result, lines = _search(GOOD, BAD, _needs("pkg-03", "pkg-12", culprit="pkg-03"))
    assert result.verdict == "found"
    assert [c.name for c in result.culprit] == ["pkg-03", "pkg-12"]
    broken = [s for s in result.steps if s.outcome == "broken"]
    assert broken and broken[0].conflicts == ["pkg-03 needs pkg-12"]
    assert any("-> broken" in line for line in lines)


def test_a_group_joined_elsewhere_leaves_a_single_culprit_single():
    result, _ = _search(GOOD, BAD, _needs("pkg-01", "pkg-14", culprit="pkg-07"))
    assert result.culprit == [PackageChange("pkg-07", "1.0", "2.0")]


def test_a_broken_step_that_names_no_change_moves_the_split():
    """uv's check names a package that is no change (or nothing): the two units beside the split join."""

    def verdict(packages: Mapping[str, str]) -> Trial:
        if packages["pkg-07"] == "2.0" and packages["pkg-08"] != "2.0":
            return Trial("broken", "pytest exited 4")
        return Trial("fail" if packages["pkg-10"] == "2.0" else "pass")

    result, _ = _search(GOOD, BAD, verdict)
    assert result.verdict == "found"
    assert result.culprit == [PackageChange("pkg-10", "1.0", "2.0")]


def test_every_step_is_run_once():
    calls: list[frozenset] = []

    def verdict(packages: Mapping[str, str]) -> Trial:
        calls.append(frozenset(packages.items()))
        # the search starts over after the join and meets sets it has tried: they are not built again
        return _needs("pkg-04", "pkg-05", culprit="pkg-04")(packages)

    result, _ = _search(GOOD, BAD, verdict)
    assert len(calls) == len(set(calls)) == len(result.steps)


@pytest.mark.parametrize(
    ("bad_outcome", "good_outcome", "verdict"),
    [("pass", "pass", "no_failure"), ("fail", "fail", "good_fails"), ("broken", "pass", "unusable")],
)
def test_ends_that_leave_nothing_to_bisect(bad_outcome, good_outcome, verdict):
    result, _ = _search(GOOD, BAD, lambda p: Trial(bad_outcome if p == BAD else good_outcome))
    assert result.verdict == verdict
    assert result.culprit == []
    assert bisect.EXIT[verdict] == (1 if verdict == "no_failure" else 2)


def test_the_result_is_its_schema():
    result, _ = _search(GOOD, BAD, lambda packages: Trial("fail" if packages["pkg-09"] == "2.0" else "pass"))
    loaded = load(BisectResult, json.dumps(asdict(result)), "bisect.json")
    assert loaded == result


# ---------------------------------------------------------------- requirement files from locks


def _hash(seed: str) -> str:
    return (seed * 64)[:64]


def _lock(
    packages: dict[str, tuple[str, list[str]]], platform: str = "x86_64-manylinux_2_28", python: str = "3.11"
) -> bytes:
    body = ""
    for name, (version, hashes) in packages.items():
        body += f"{name}=={version} \\\n"
        body += " \\\n".join(f"    --hash=sha256:{h}" for h in hashes) + "\n    # via -r cell.in\n"
    fields = [("cell", "cpu"), ("platform", platform), ("python", python), ("uv", "0.13.9"), ("inputs", "sha256:0")]
    return (render_header(fields, body, "cpu") + body).encode()


GOOD_LOCK = {"alpha": ("1.0", [_hash("a"), _hash("b")]), "beta": ("1.0", [_hash("c")]), "gamma": ("1.0", [_hash("d")])}
BAD_LOCK = {"alpha": ("1.0", [_hash("a"), _hash("b")]), "beta": ("2.0", [_hash("e")]), "delta": ("3.0", [_hash("f")])}


def test_a_composed_environment_takes_each_line_from_the_lock_that_has_that_version():
    good, bad = parse_lock(_lock(GOOD_LOCK)), parse_lock(_lock(BAD_LOCK))
    changes = differences(good.packages, bad.packages)
    assert [c.describe() for c in changes] == ["beta 1.0 -> 2.0", "delta (added) 3.0", "gamma 1.0 (removed)"]
    text = requirements_text(compose(good.packages, changes[:1]), (good, bad))
    assert text == (
        f"alpha==1.0 \\\n    --hash=sha256:{_hash('a')} \\\n    --hash=sha256:{_hash('b')}\n"
        f"beta==2.0 \\\n    --hash=sha256:{_hash('e')}\n"
        f"gamma==1.0 \\\n    --hash=sha256:{_hash('d')}\n"
    )
    requirements, problems = parse_body(text)
    assert problems == []
    assert {r.name: r.version for r in requirements} == {"alpha": "1.0", "beta": "2.0", "gamma": "1.0"}


def test_a_version_no_lock_has_is_refused():
    good = parse_lock(_lock(GOOD_LOCK))
    with pytest.raises(BisectInputError, match=r"beta==9\.9: no lock lists it with a hash"):
        requirements_text({"beta": "9.9"}, (good,))


def test_uvs_check_names_the_requirer_and_the_required():
    output = (
        "Checked 3 packages in 1ms\nFound 2 incompatibilities\n"
        "The package `transformers` requires `huggingface-hub>=1.3.0,<2.0`, but `2.4.0` is installed\n"
        "The package `Huggingface_Hub` requires `httpx2[http2]>=2.0; extra == 'x'`, but it's not installed\n"
    )
    assert unmet_requirements(output) == [("transformers", "huggingface-hub"), ("huggingface-hub", "httpx2")]


def test_a_steps_search_path_keeps_what_is_outside_the_checkout(tmp_path):
    """CANN's Python packages (on PYTHONPATH on an Ascend host) reach the tests; the checkout's src,
    which would shadow the gdn installed in the step's environment, does not."""
    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    cann = "/usr/local/Ascend/ascend-toolkit/latest/python/site-packages"
    search_path = os.pathsep.join([str(root / "src"), cann, "", str(root)])
    assert bisect_env.outside(search_path, root) == cann


# ---------------------------------------------------------------- the command's refusals


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _main(tmp_path: Path, good: Path, bad: Path, *extra: str) -> int:
    arguments = ["cpu", "--good", str(good), "--bad", str(bad), "--work", str(tmp_path / "work")]
    return bisect.main([*arguments, "--matrix", str(ROOT / "matrix.yaml"), "--root", str(ROOT), *extra])


def test_a_lock_with_a_pip_option_is_refused_naming_its_line(tmp_path, capsys):
    good = _write(tmp_path, "good.txt", _lock(GOOD_LOCK))
    text = _lock(BAD_LOCK).decode()
    bad = _write(
        tmp_path, "bad.txt", text.replace("beta==2.0", "--index-url https://example.invalid/\nbeta==2.0").encode()
    )
    assert _main(tmp_path, good, bad) == 2
    error = capsys.readouterr().err
    assert f"--bad {bad} is refused" in error
    assert "'--index-url https://example.invalid/' is a pip option" in error
    assert not (tmp_path / "work").exists()


def test_an_edited_lock_is_refused_by_its_digest(tmp_path, capsys):
    good = _write(tmp_path, "good.txt", _lock(GOOD_LOCK))
    bad = _write(tmp_path, "bad.txt", _lock(BAD_LOCK).replace(b"delta==3.0", b"delta==3.1"))
    assert _main(tmp_path, good, bad) == 2
    assert "is not what `gdn-matrix lock` wrote" in capsys.readouterr().err


def test_locks_for_two_platforms_are_refused(tmp_path, capsys):
    good = _write(tmp_path, "good.txt", _lock(GOOD_LOCK))
    bad = _write(tmp_path, "bad.txt", _lock(BAD_LOCK, platform="aarch64-manylinux_2_28"))
    assert _main(tmp_path, good, bad) == 2
    assert "the locks are for two platforms" in capsys.readouterr().err


def test_a_node_id_that_pytest_would_read_as_an_option_is_refused(tmp_path, capsys):
    good = _write(tmp_path, "good.txt", _lock(GOOD_LOCK))
    bad = _write(tmp_path, "bad.txt", _lock(BAD_LOCK))
    assert _main(tmp_path, good, bad, "--test=--import-mode=append") == 2
    assert "--test: expected a pytest node id" in capsys.readouterr().err


def test_the_command_runs_the_search_over_its_environments(tmp_path, monkeypatch, capsys):
    """The command between parsing and bisect.json, with the environments' trial replaced by a verdict
    on the package set (the composition of each set's requirement file still runs)."""
    written: list[str] = []

    def verdict(self, packages: Mapping[str, str]) -> Trial:
        written.append(requirements_text(packages, self.locks))
        return Trial("fail" if packages.get("delta") == "3.0" else "pass", "1 failed")

    monkeypatch.setattr(bisect_env.Environments, "__call__", verdict)
    good = _write(tmp_path, "good.txt", _lock(GOOD_LOCK))
    bad = _write(tmp_path, "bad.txt", _lock(BAD_LOCK))
    assert _main(tmp_path, good, bad, "--test", "tests/t.py::test_x") == 0
    out = capsys.readouterr().out
    assert "flips the tests: delta (added) 3.0" in out
    result = load(BisectResult, (tmp_path / "work" / bisect.RESULT).read_bytes(), "bisect.json")
    assert result.verdict == "found"
    assert result.tests == ["tests/t.py::test_x"]
    assert [c.name for c in result.culprit] == ["delta"]
    assert len(written) == len(result.steps)


def test_without_a_test_the_cells_failing_tests_are_bisected(tmp_path, monkeypatch, capsys):
    selections: list[list[str]] = []

    def failing(self, packages: Mapping[str, str], selection: list[str]) -> tuple[list[str], Trial]:
        selections.append(selection)
        assert packages == parse_lock(_lock(BAD_LOCK)).packages
        return ["tests/ops/test_x.py::test_y"], Trial("fail", "1 failed, 3 passed")

    monkeypatch.setattr(bisect_env.Environments, "failing_tests", failing)
    monkeypatch.setattr(
        bisect_env.Environments, "__call__", lambda self, p: Trial("fail" if p.get("beta") == "2.0" else "pass")
    )
    good = _write(tmp_path, "good.txt", _lock(GOOD_LOCK))
    bad = _write(tmp_path, "bad.txt", _lock(BAD_LOCK))
    assert _main(tmp_path, good, bad) == 0
    # the cpu cell's families, as its entry selects them
    assert selections[0][:3] == [str(ROOT / "tests"), "-m", "probe or single_op or shape_grid or grpo"]
    assert "failing: tests/ops/test_x.py::test_y" in capsys.readouterr().out
    result = load(BisectResult, (tmp_path / "work" / bisect.RESULT).read_bytes(), "bisect.json")
    assert result.tests == ["tests/ops/test_x.py::test_y"]
    assert [c.describe() for c in result.culprit] == ["beta 1.0 -> 2.0"]


def test_a_bad_lock_whose_tests_pass_leaves_nothing_to_bisect(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        bisect_env.Environments, "failing_tests", lambda self, packages, selection: ([], Trial("pass", "9 passed"))
    )
    good = _write(tmp_path, "good.txt", _lock(GOOD_LOCK))
    bad = _write(tmp_path, "bad.txt", _lock(BAD_LOCK))
    assert _main(tmp_path, good, bad) == 1
    assert "the bad lock's tests do not fail: nothing to bisect" in capsys.readouterr().out
    result = load(BisectResult, (tmp_path / "work" / bisect.RESULT).read_bytes(), "bisect.json")
    assert (result.verdict, result.bad_lock) == ("no_failure", str(bad))


# ---------------------------------------------------------------- real environments (uv, PyPI)

# pure-Python packages of the cpu cell's lock: real hashes of real files, a few MB in all
SMALL = ("iniconfig", "packaging", "pluggy", "pygments", "pytest")
PROBE = """
import importlib.util


def test_no_sortedcontainers():
    assert importlib.util.find_spec("sortedcontainers") is None
"""


def test_real_environments_find_the_group_that_installs_together(tmp_path):
    """uv builds each step from PyPI: hypothesis needs sortedcontainers, so a step with hypothesis alone is broken
    (uv pip check), and the two are found together as what flips a test that sortedcontainers fails."""
    pytest.importorskip("uv", reason="the environments are made with uv (the matrix extra)")
    cpu = parse_lock((ROOT / "locks" / "cpu.txt").read_bytes())
    entry = {name: (cpu.packages[name], list(cpu.hashes[name])) for name in (*SMALL, "hypothesis", "sortedcontainers")}
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    good = parse_lock(_lock({name: entry[name] for name in SMALL}, python=python))
    bad = parse_lock(_lock(entry, python=python))
    probe = tmp_path / "probe_test.py"
    probe.write_text(PROBE)
    environments = bisect_env.Environments(
        root=ROOT, work=tmp_path / "work", locks=(good, bad), timeout_s=300, tests=(str(probe),)
    )
    result, lines = _search(good.packages, bad.packages, environments)
    assert [s.outcome for s in result.steps] == ["fail", "pass", "broken"], lines
    assert result.steps[2].conflicts == ["hypothesis needs sortedcontainers"]
    assert result.verdict == "found"
    assert [c.name for c in result.culprit] == ["hypothesis", "sortedcontainers"]
    # each step installed gdn from this checkout, without its dependencies (no torch)
    installed = list((tmp_path / "work" / "env-01" / "venv" / "lib").glob("python*/site-packages/gdn/__init__.py"))
    assert installed


def test_the_gdn_wheel_holds_the_checkout_as_it_is_and_writes_nothing_into_it(tmp_path):
    """setuptools puts into a wheel whatever its build/ directory still holds: a module an earlier build
    left there (removed from src/ since) must not come back in the wheel every step installs, and the
    build leaves no build/ or egg-info in the checkout."""
    pytest.importorskip("uv", reason="the wheel is built with uv (the matrix extra)")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, checkout / name)
    shutil.copytree(ROOT / "src", checkout / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    stale = checkout / "build" / "lib" / "gdn" / "removed_module.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("LEFT_BY_AN_EARLIER_BUILD = True\n")
    before = sorted(str(p.relative_to(checkout)) for p in checkout.rglob("*"))
    cpu = parse_lock((ROOT / "locks" / "cpu.txt").read_bytes())
    environments = bisect_env.Environments(root=checkout, work=tmp_path / "work", locks=(cpu, cpu), timeout_s=300)
    with zipfile.ZipFile(environments.gdn_wheel()) as wheel:
        names = wheel.namelist()
    assert "gdn/matrix/bisect_env.py" in names
    assert "gdn/removed_module.py" not in names
    assert sorted(str(p.relative_to(checkout)) for p in checkout.rglob("*")) == before
