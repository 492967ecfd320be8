"""Where the tests find the checkout, whatever folder a test module sits in: its root (src/, docs/,
bench/, the CI files) and tests/ itself, which holds the shared data, helpers and stand-ins."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SRC = ROOT / "src"
