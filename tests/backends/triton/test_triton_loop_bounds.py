"""Loops whose bound a kernel reads from memory (a sequence's chunk count from cu_seqlens, a call's row
count): the kernels write them as one `for` loop, which the interpreter of every supported Triton must
run as the compiler does. Triton < 3.9's interpreter converts such a bound with int() of a one-element
array, which numpy 2.4 rejects, unless gdn's kernel helpers are imported (they install the conversion
Triton 3.9 makes).

Without a CUDA device the kernels run under the Triton interpreter, set before they are decorated."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

import gdn.backends.triton.common.tiles  # noqa: E402,F401 - the kernels' helpers, as every kernel module imports them

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 16


@triton.jit
def _row_sums_kernel(x, counts, out, BLOCK: tl.constexpr):
    """out[p] = the sum of the first counts[p] rows of x (BLOCK columns), stepping one row and then
    two at a time: both loops take a bound read from memory."""
    p = tl.program_id(0)
    n = tl.load(counts + p)
    o = tl.arange(0, BLOCK)
    ones = tl.zeros([BLOCK], dtype=tl.float32)
    for r in range(0, n):
        ones += tl.load(x + r * BLOCK + o)
    evens = tl.zeros([BLOCK], dtype=tl.float32)
    for r in range(0, n, 2):
        evens += tl.load(x + r * BLOCK + o)
    tl.store(out + p * 2 * BLOCK + o, ones)
    tl.store(out + p * 2 * BLOCK + BLOCK + o, evens)


@pytest.mark.single_op
def test_loop_bound_read_in_the_kernel(gen):
    counts = torch.randint(1, 9, (3,), generator=gen, dtype=torch.int32)
    x = torch.randn(int(counts.max()), BLOCK, generator=gen)
    out = torch.empty(len(counts), 2, BLOCK)
    x_d, counts_d, out_d = x.to(DEVICE), counts.to(DEVICE), out.to(DEVICE)

    _row_sums_kernel[(len(counts),)](x_d, counts_d, out_d, BLOCK=BLOCK)

    x64 = x.double()
    expected = torch.stack([torch.stack([x64[:n].sum(0), x64[:n:2].sum(0)]) for n in counts.tolist()])
    err = ((out_d.cpu().double() - expected).norm() / expected.norm()).item()
    assert err < 1e-6, f"row sums off by {err:.2e} (counts {counts.tolist()})"
