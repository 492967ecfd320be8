"""Shared test setup: tests/ on sys.path for what the test modules share (the references, the input
factories, repo_paths, the stand-ins), whatever folder they sit in, a clean resolver per test, and fresh
random inputs whose seed is printed so a failure can be replayed (GDN_TEST_SEED=<seed>)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One intra-op thread per xdist worker: the workers already fill the cores, and oversubscribed
    # threads make the many small ops of the references several times slower.
    torch.set_num_threads(1)


# The matrix's test families, plus `tooling` for tests of the matrix code itself, which cells never select.
FAMILIES = ("probe", "single_op", "shape_grid", "grpo", "tooling")


def pytest_collection_modifyitems(config, items):
    """Every test belongs to exactly one family; the family travels to the JUnit report as a property
    so the matrix report can count per family (xdist keeps per-test properties)."""
    unmarked = []
    for item in items:
        families = sorted({m.name for m in item.iter_markers() if m.name in FAMILIES})
        if len(families) != 1:
            unmarked.append(f"{item.nodeid}: {families or 'no family marker'}")
            continue
        item.user_properties.append(("family", families[0]))
    if unmarked:
        raise pytest.UsageError(
            "tests must carry exactly one family marker " + str(FAMILIES) + ":\n  " + "\n  ".join(unmarked)
        )


@pytest.fixture(autouse=True)
def _fresh_resolution():
    """Each test starts from the default compute mode and no cached decisions."""
    import gdn
    import gdn.resolve

    yield
    gdn.set_compute_mode(None)
    gdn.resolve.reset()


@pytest.fixture
def gen(request) -> torch.Generator:
    # imported here: the sessions that run tests/ci alone may not have gdn on the path
    from gdn.matrix.outcomes import draw_seed

    return torch.Generator().manual_seed(draw_seed(request.node))
