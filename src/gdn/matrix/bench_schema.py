"""bench.json of an accelerator cell: one typed row per (op, backend, shape, pass).

The rows are plain dataclasses so that the cell's benchmark writes them without pydantic (cell images
carry only torch, the test tools and the stack under test); the report validates what it reads with
pydantic against these same classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

BENCH_SCHEMA = 2
Pass = Literal["fwd", "fwd+bwd", "decode"]


@dataclass
class BenchRow:
    """One timing, or the reason there is none (backend unavailable or rejected, budget spent).

    `implementation` is what actually ran: the resolved route (e.g. "triton:bundled", "fla:0.6.0") and,
    for a peer that dispatches on its own, the kernel it chose ("fla:0.6.0 -> flash_qla").
    `ratio_to_fastest` is ms over the fastest timed backend of the same (op, shape, pass)."""

    op: str
    backend: str
    shape: dict[str, int]
    pass_: Pass
    implementation: str | None = None
    ms: float | None = None
    peak_gib: float | None = None
    ratio_to_fastest: float | None = None
    first_call_s: float | None = None
    reason: str | None = None
    note: str | None = None

    def key(self) -> tuple[str, str, str, str]:
        return (self.op, self.backend, shape_text(self.shape), self.pass_)

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["pass"] = data.pop("pass_")
        return data


@dataclass
class BenchFile:
    environment: dict[str, Any]
    rows: list[BenchRow] = field(default_factory=list)
    schema: int = BENCH_SCHEMA
    budget_s: float | None = None
    elapsed_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "environment": self.environment,
            "budget_s": self.budget_s,
            "elapsed_s": self.elapsed_s,
            "rows": [row.to_json() for row in self.rows],
        }


def shape_text(shape: dict[str, int]) -> str:
    """B=4 T=4096 H=16 HV=32 K=V=128 (K and V merged when equal)."""
    parts = dict(shape)
    if "K" in parts and parts.get("K") == parts.get("V"):
        parts["K=V"] = parts.pop("K")
        parts.pop("V")
    return " ".join(f"{k}={v}" for k, v in parts.items())


def parse_rows(raw: Any) -> tuple[list[BenchRow], list[str]]:
    """The typed rows of a bench.json's 'rows' list, and a problem per row that does not validate.
    Rows of the older untyped form (impl, fwd/fwd_bwd) are not speed-table rows: they are skipped."""
    from pydantic import TypeAdapter, ValidationError

    adapter = TypeAdapter(BenchRow)
    rows, problems = [], []
    for i, item in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(item, dict) or "backend" not in item:
            continue
        data = {("pass_" if k == "pass" else k): v for k, v in item.items()}
        try:
            rows.append(adapter.validate_python(data))
        except ValidationError as exc:
            problems.append(f"bench.json row #{i} is not a bench row: {exc.errors()[0]['msg']}")
    return rows, problems
