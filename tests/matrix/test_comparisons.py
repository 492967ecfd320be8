"""What a backend comparison compared, as the report says it and the diff gates it: a comparison test
records its cases left out (`not_compared`: case -> why) beside the ops it compared, so a test that
compared the padded cases and skipped the packed one is never shown as having compared all of it, and a
case that a new report no longer compares is a loss of the diff, like an op."""

from __future__ import annotations

import pytest

from gdn.matrix.kernel_report import comparison_losses, comparison_text, comparisons
from gdn.matrix.outcomes import FinishedTest
from report_models import typed_cell

pytestmark = pytest.mark.tooling

TEST = "tests/ops/test_grpo.py::test_backend_matches_eager[triton]"
OPS = {"chunk_gated_delta_rule": "triton:bundled", "causal_conv1d_fn": "triton:bundled"}
PACKED = "transformers 5.2.0: Qwen3_5GatedDeltaNet never receives the packed-sequence offsets"


def _finished(not_compared: dict[str, str] | None) -> FinishedTest:
    comparison = {"mode": "triton", "compared": OPS, "fell_back": {}}
    if not_compared is not None:
        comparison["not_compared"] = not_compared
    return FinishedTest(TEST, "skipped", "grpo", "XFailed: not compared", comparison=comparison)


def _cell(not_compared: dict[str, str] | None) -> dict:
    comparison = {"test": TEST, "outcome": "passed", "mode": "triton", "compared": OPS, "fell_back": {}}
    if not_compared is not None:
        comparison["not_compared"] = not_compared
    return {"name": "cpu", "status": "passed", "comparisons": [comparison]}


def test_a_comparison_that_left_a_case_out_says_which_and_why():
    [partial] = comparisons([_finished({"dense/packed": PACKED})])
    assert partial.not_compared == {"dense/packed": PACKED}
    assert comparison_text(partial) == (
        "triton compared on 2 of 2 ops (chunk_gated_delta_rule, causal_conv1d_fn); "
        f"not compared: dense/packed ({PACKED})"
    )
    [whole] = comparisons([_finished({})])
    assert comparison_text(whole) == "triton compared on 2 of 2 ops (chunk_gated_delta_rule, causal_conv1d_fn)"


def test_a_comparison_that_names_no_cases_reads_as_before():
    [older] = comparisons([_finished(None)])
    assert older.not_compared is None
    assert comparison_text(older) == "triton compared on 2 of 2 ops (chunk_gated_delta_rule, causal_conv1d_fn)"


def test_a_case_the_new_report_no_longer_compares_is_a_loss():
    old, new = typed_cell(_cell({})), typed_cell(_cell({"dense/packed": PACKED}))
    [loss] = comparison_losses("cpu", old, new)
    assert loss.lost == ["dense/packed"]
    assert loss.text() == f"cpu: `{TEST}` no longer compares dense/packed (dense/packed: {PACKED})"
    assert comparison_losses("cpu", new, old) == []
    assert comparison_losses("cpu", new, new) == []


def test_an_older_report_without_cases_loses_none():
    """A report written before the tests named their cases says nothing of them: no case is lost
    against it (its ops still are)."""
    older, new = typed_cell(_cell(None)), typed_cell(_cell({"dense/packed": PACKED}))
    assert comparison_losses("cpu", older, new) == []
    fewer_ops = _cell({"dense/packed": PACKED})
    fewer_ops["comparisons"][0]["compared"] = {"causal_conv1d_fn": "triton:bundled"}
    [loss] = comparison_losses("cpu", older, typed_cell(fewer_ops))
    assert loss.lost == ["chunk_gated_delta_rule"]
