"""The tests' layout: every test file the checkout names outside tests/ (the noxfile's sessions, CI, the
bench studies, the README and docs/) exists, so a test module that moves leaves no session, study or page
pointing at nothing; and every folder of test modules is a package, so pytest names each module by its
path (tests.ops.test_x) and two modules of one name in two folders cannot collide."""

from __future__ import annotations

import re

import pytest

from repo_paths import ROOT, TESTS

pytestmark = pytest.mark.tooling

# docs/samples/ keeps the logs of past runs as they were: the paths there are history, not references
NAMING = ["noxfile.py", ".ci/run", "README.md", "bench/*.py", "bench/*.sh", "docs/*.md", ".github/workflows/*.yml"]
TEST_FILE = re.compile(r"\btests/[\w/]*test_\w+\.py")


def named_test_files() -> list[tuple[str, str]]:
    files = sorted({path for pattern in NAMING for path in ROOT.glob(pattern)})
    return [(str(f.relative_to(ROOT)), m.group(0)) for f in files for m in TEST_FILE.finditer(f.read_text())]


def test_every_test_file_named_outside_the_tests_exists():
    named = named_test_files()
    assert any(name == "noxfile.py" for name, _ in named), "the noxfile names the kernels session's test files"
    missing = [f"{name}: {path}" for name, path in named if not (ROOT / path).is_file()]
    assert not missing, "named but not there:\n" + "\n".join(missing)


def test_every_folder_of_test_modules_is_a_package():
    folders = sorted({path.parent for path in TESTS.rglob("test_*.py")})
    assert TESTS in folders or len(folders) > 1
    bare = [str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()]
    assert not bare, "folders of test modules without an __init__.py: " + ", ".join(bare)
