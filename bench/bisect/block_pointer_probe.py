"""The test that `bench/bisect_cpu.sh` bisects: a Triton kernel that reads and writes through block
pointers (`tl.make_block_ptr`, as kernels written for Triton 3.2 do) runs under Triton's interpreter.
Triton 3.9's interpreter raises NotImplementedError for block pointers (they gave way to tensor
descriptors), which is why gdn's own kernels use plain pointer arithmetic with masks; this test keeps
the old style on purpose, so that it passes with Triton 3.2 and fails with 3.9."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _double(x, y, n, BLOCK: tl.constexpr):
    start = tl.program_id(0) * BLOCK
    source = tl.make_block_ptr(x, (n,), (1,), (start,), (BLOCK,), (0,))
    target = tl.make_block_ptr(y, (n,), (1,), (start,), (BLOCK,), (0,))
    tl.store(target, tl.load(source, boundary_check=(0,)) * 2, boundary_check=(0,))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs under Triton's interpreter (CPU)")
def test_block_pointer_kernel_runs_under_the_interpreter():
    x = torch.randn(37, dtype=torch.float32)
    y = torch.empty_like(x)
    block = 16
    _double[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), BLOCK=block)
    torch.testing.assert_close(y, 2 * x)
