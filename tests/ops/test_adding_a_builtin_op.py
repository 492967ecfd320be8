"""docs/design.md's "Adding a built-in op", done on a copy of the package: a toy op, `scaled_sum(x, y, *,
alpha)`, written into three files of it (its declaration in gdn/calls.py, its eager implementation in
an eager module, its triton kernel in a module of its own, which also declares it forward-only and its
probe's bound); this test is the fourth. Nothing else of the package changes, and the op is then
exported, validated, resolved under the triton compute mode after its numeric probe (to its own bound,
forward only), and a custom op, in a fresh process that imports the copy."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import ROOT

pytestmark = pytest.mark.tooling

# the op's declaration: its spec, call type, build (the validation) and probe cases, in gdn/calls.py
DECLARATION = '''

@dataclass(slots=True)
class ScaledSumCall(Call):
    x: torch.Tensor
    y: torch.Tensor
    alpha: float


def _scaled_sum_cases(gen: torch.Generator, cls: ProbeClass) -> Iterator[Case]:
    yield Case("rows", dict(x=_randn(gen, 4, 33), y=_randn(gen, 4, 33)))


@builtin(
    OpSpec("scaled_sum", (Arg("x"), Arg("y"), Arg("alpha", "float", 1.0, True)), (Output("out", like="x"),)),
    probe_cases=_scaled_sum_cases,
)
def scaled_sum(spec: OpSpec, arguments: Arguments) -> ScaledSumCall:
    """alpha * x + y, for x and y of one shape and dtype."""
    c = check.Checker(spec.name)
    x, y = c.tensor("x", arguments["x"]), c.tensor("y", arguments["y"])
    c.float_dtype("x", x)
    c.same_dtype("y", y, "x", x)
    c.shape("y", y, list(x.shape), "(same as x)")
    c.same_device({"x": x, "y": y})
    return ScaledSumCall(x, y, c.positive_real("alpha", arguments["alpha"], "a positive real number"))
'''

# its eager implementation: a function named like the op in an eager module
EAGER = """

def scaled_sum(call) -> torch.Tensor:
    return (call.alpha * call.x.float() + call.y.float()).to(call.x.dtype)
"""

# its triton implementation, declared in its module's `OPS` with what the backend says of it
TRITON = '''"""scaled_sum in Triton: out = alpha * x + y over the flattened elements, in fp32."""

import torch
import triton
import triton.language as tl

from gdn.backends.triton._common import OpKernel

BLOCK = 1024


@triton.jit(do_not_specialize=["n"])
def _scaled_sum_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, (alpha * x + y).to(out_ptr.dtype.element_ty), mask=mask)


def scaled_sum(call) -> torch.Tensor:
    x, y = call.x.contiguous(), call.y.contiguous()
    out = torch.empty_like(x)
    _scaled_sum_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, out, x.numel(), call.alpha, BLOCK=BLOCK)
    return out


# served without a backward, and probed to a bound of its own
OPS = {"scaled_sum": OpKernel(scaled_sum, forward_only=True, probe_tolerance=1e-6)}
'''

WRITTEN = ("gdn/calls.py", "gdn/backends/eager/pointwise.py", "gdn/backends/triton/scaled_sum.py")

# what the fresh process checks and reports
SCRIPT = """
import json

import torch

import gdn
from gdn.op_names import OP_NAMES

gen = torch.Generator().manual_seed(0)
x, y = torch.randn(5, 7, generator=gen), torch.randn(5, 7, generator=gen)
try:
    gdn.scaled_sum(x, torch.randn(5, 6))
except ValueError as exc:
    refused = str(exc)
gdn.set_compute_mode("triton")
out = gdn.scaled_sum(x, y, alpha=0.5)
[record] = [r for r in gdn.resolutions() if r["op"] == "scaled_sum"]
ref = 0.5 * x.double() + y.double()
print(json.dumps({
    "module": gdn.__file__,
    "exported": "scaled_sum" in gdn.__all__ and "scaled_sum" in OP_NAMES,
    "refused": refused,
    "rel_err": ((out.double() - ref).norm() / ref.norm()).item(),
    "backend": record["backend"],
    "probe": record["probe"]["passed"],
    "probe_cases": sorted(record["probe"]["rel_err"]),
    "probe_tolerance": record["probe"]["tolerance"],
    "forward_only": record["forward_only"],
    "schema": str(torch.ops.gdn.scaled_sum.default._schema),
}))
"""


def _tree_without_caches(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))


def _changed(before: Path, after: Path) -> list[str]:
    """The files of `after` that `before` lacks or holds otherwise, relative to it."""
    changed = []
    for path in sorted(after.rglob("*.py")):
        relative = path.relative_to(after)
        old = before / relative
        if not old.is_file() or not filecmp.cmp(old, path, shallow=False):
            changed.append(str(relative))
    return changed


def test_a_builtin_op_added_in_its_three_files_is_exported_validated_resolved_and_probed(tmp_path: Path) -> None:
    pytest.importorskip("triton", reason="the toy op's triton kernel needs triton (run under its interpreter)")
    src = tmp_path / "src"
    _tree_without_caches(ROOT / "src", src)
    for relative, text in zip(WRITTEN, (DECLARATION, EAGER, None), strict=True):
        path = src / relative
        if text is None:
            path.write_text(TRITON)
        else:
            path.write_text(path.read_text() + text)
    assert _changed(ROOT / "src", src) == sorted(WRITTEN)

    env = {**os.environ, "PYTHONPATH": str(src), "TRITON_INTERPRET": "1"}
    for name in ("GDN_COMPUTE_MODE", "GDN_VALUE_CHECKS"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["module"] == str(src / "gdn" / "__init__.py")
    assert got["exported"]
    assert got["refused"] == "scaled_sum: argument 'y' expected shape (same as x) = [5, 7], got [5, 6]"
    assert got["rel_err"] < 1e-6
    assert (got["backend"], got["probe"], got["probe_cases"]) == ("triton", True, ["rows.out0"])
    assert (got["forward_only"], got["probe_tolerance"]) == (True, 1e-6)
    assert got["schema"] == "gdn::scaled_sum(Tensor x, Tensor y, float alpha) -> Tensor"
