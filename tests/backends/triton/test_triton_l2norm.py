"""The triton backend's l2norm kernels: forward and backward against fp64, the interface the chunk
kernels build on, and no new binary for a new row count.

Without a CUDA device the kernels run under the Triton interpreter (TRITON_INTERPRET=1), which
Triton reads when a kernel is decorated: it is set here before the kernel module is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from gdn.backends.triton import l2norm as kernels
from gdn.calls import L2NormCall

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
EPS = 1e-6
# fp32: a few ulps of rounding; 16-bit: the output's own rounding (bf16 keeps 8 bits, about 4e-3 at
# most) plus the backward reading y back in 16 bits.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
# Row counts of packed batches a few tokens apart: 32768 and 4800 are multiples of 16, 32776 and
# 32780 are not, so any argument that Triton specializes by divisibility would split them.
ROW_COUNTS = (32768, 32776, 32780, 4800)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).norm() / expected.norm()).item()


def fp64_reference(x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x64 = x.detach().double().requires_grad_(True)
    y = x64 * torch.rsqrt((x64 * x64).sum(-1, keepdim=True) + EPS)
    (dx,) = torch.autograd.grad(y, x64, dy.double())
    return y.detach(), dx


# ---------------------------------------------------------------------------------------------------
# numerics


@pytest.mark.shape_grid
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("D", [60, 64, 100, 128, 512, 1000])
def test_forward_and_backward_match_fp64(D, dtype, gen):
    # 3 x 37 = 111 rows: odd, and not a multiple of the rows per program; D = 1000 takes the path
    # that sweeps a row in blocks.
    x = (torch.randn(3, 37, D, generator=gen) * 3).to(DEVICE, dtype).requires_grad_(True)
    dy = torch.randn(3, 37, D, generator=gen).to(DEVICE, dtype)
    ref_y, ref_dx = fp64_reference(x, dy)

    y = kernels.l2norm(L2NormCall(x, EPS))
    y.backward(dy)

    assert y.dtype == dtype and x.grad.dtype == dtype
    assert rel_err(y, ref_y) <= TOLERANCE[dtype]
    assert rel_err(x.grad, ref_dx) <= TOLERANCE[dtype]


@pytest.mark.single_op
def test_interface_used_by_the_chunk_kernels(gen):
    """l2norm_fwd(x, eps) -> (y in x's dtype and shape, rstd fp32 per row); l2norm_bwd(y, rstd, dy) -> dx."""
    x = torch.randn(2, 5, 3, 128, generator=gen).to(DEVICE, torch.bfloat16)
    y, rstd = kernels.l2norm_fwd(x, EPS)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert rstd.shape == x.shape[:-1] and rstd.dtype == torch.float32
    x32 = x.float()
    torch.testing.assert_close(rstd, torch.rsqrt((x32 * x32).sum(-1) + EPS), rtol=1e-5, atol=0)

    dy = torch.randn(x.shape, generator=gen).to(DEVICE, torch.bfloat16)
    dx = kernels.l2norm_bwd(y, rstd, dy)
    assert dx.shape == x.shape and dx.dtype == torch.bfloat16
    _, ref_dx = fp64_reference(x, dy)
    assert rel_err(dx, ref_dx) <= TOLERANCE[torch.bfloat16]


@pytest.mark.single_op
def test_strided_input_zero_rows_and_no_rows(gen):
    # A transposed view (rows not contiguous), with one all-zero row: y = 0 there, rstd = eps^-1/2
    # and dx = rstd * dy, all finite.
    x = torch.randn(100, 9, generator=gen).to(DEVICE).t()
    x[4] = 0.0
    x.requires_grad_(True)
    dy = torch.randn(9, 100, generator=gen).to(DEVICE)
    y = kernels.l2norm(L2NormCall(x, EPS))
    y.backward(dy)
    ref_y, ref_dx = fp64_reference(x, dy)
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert y[4].abs().max() == 0
    assert rel_err(y, ref_y) <= 1e-5 and rel_err(x.grad, ref_dx) <= 1e-5

    empty = torch.randn(0, 7, 64, device=DEVICE)
    y, rstd = kernels.l2norm_fwd(empty, EPS)
    assert y.shape == (0, 7, 64) and rstd.shape == (0, 7)
    assert kernels.l2norm_bwd(y, rstd, torch.empty_like(y)).shape == (0, 7, 64)


# ---------------------------------------------------------------------------------------------------
# one binary across row counts


class LaunchRecorder:
    """Stands in for a kernel: records the arguments of each `kernel[grid](...)` launch without
    running it (only the arguments decide the binary; the interpreter would take seconds per launch
    at these sizes)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launches: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((args, kwargs))

        return launch


def interpreted(kernel) -> bool:
    return hasattr(kernel, "rewriter")  # InterpretedFunction, in every Triton the matrix carries


def compiled_function(kernel, **overrides):
    """A JITFunction of the kernel's Python function with the kernel's specialization settings
    (an interpreted kernel keeps its @triton.jit arguments on its rewriter)."""
    from triton.runtime.jit import JITFunction

    options = kernel.rewriter.kwargs if interpreted(kernel) else vars(kernel)
    settings = {name: options.get(name) for name in ("do_not_specialize", "do_not_specialize_on_alignment")}
    return JITFunction(kernel.fn, **{**settings, **overrides})


def triton_backend():
    """The compiler backend of the active target; under the interpreter (no driver) a CUDA one, whose
    compiler ships in every triton wheel and needs no GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime import driver

    try:
        target = driver.active.get_current_target()
    except RuntimeError:  # no active driver
        target = GPUTarget("cuda", 90, 32)
    return make_backend(target)


def launch_key(jit_function, args: tuple, kwargs: dict) -> str:
    """The key JITFunction.run files the compiled binary of this launch under, computed with the
    binder run() uses (triton.runtime.jit.create_function_from_signature), so it needs no GPU.
    Triton 3.2's binder returns (bound args, signature and specialization strings, constexpr
    values, runtime values, extra kwargs) and run() keys on all but the bound and runtime values;
    from 3.3 on it returns (bound args, [(type, specialization)], options) and run() keys on the
    last two."""
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(jit_function.signature, jit_function.params, triton_backend())
    bound = binder(*args, **kwargs)
    if len(bound) == 5:
        _, signature_and_specialization, constexprs, _, extra = bound
        return "".join(signature_and_specialization) + str((constexprs, extra))
    _, specialization, options = bound
    return str(specialization) + str(options)


KERNELS = ("_l2norm_fwd_kernel", "_l2norm_bwd_kernel")


def launch_at_row_counts(D: int = 128) -> None:
    for rows in ROW_COUNTS:
        x = torch.randn(rows, D, device=DEVICE, dtype=torch.bfloat16)
        y, rstd = kernels.l2norm_fwd(x, EPS)
        kernels.l2norm_bwd(y, rstd, torch.randn_like(x))


@pytest.mark.single_op
def test_launch_key_is_the_same_for_every_row_count(monkeypatch):
    recorders = {name: LaunchRecorder(getattr(kernels, name)) for name in KERNELS}
    for name, recorder in recorders.items():
        monkeypatch.setattr(kernels, name, recorder)
    launch_at_row_counts()
    for name, recorder in recorders.items():
        kernel = recorder.kernel
        assert len(recorder.launches) == len(ROW_COUNTS), name
        rows_seen = {args[4] if name == "_l2norm_bwd_kernel" else args[3] for args, _ in recorder.launches}
        assert rows_seen == set(ROW_COUNTS), name

        keys = {launch_key(compiled_function(kernel), args, kwargs) for args, kwargs in recorder.launches}
        assert len(keys) == 1, f"{name}: {len(keys)} binaries for row counts {ROW_COUNTS}: {keys}"

        # The key does see the row count once it is specialized: these row counts fall in
        # different divisibility classes, so the check above can fail.
        specialized = compiled_function(kernel, do_not_specialize=[])
        keys = {launch_key(specialized, args, kwargs) for args, kwargs in recorder.launches}
        assert len(keys) > 1, name


def compiled_binaries(kernel) -> int:
    """How many binaries a JITFunction holds: Triton >= 3.3 keeps device -> (binaries, keys, target,
    backend, binder) in device_caches, Triton 3.2 keeps device -> {key: binary} in cache."""
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(binaries) for binaries in kernel.cache.values())


@pytest.mark.single_op
@pytest.mark.skipif(
    not CUDA or interpreted(kernels._l2norm_fwd_kernel), reason="counts compiled binaries: needs CUDA, no interpreter"
)
def test_one_compiled_binary_per_kernel_across_row_counts():
    kernel_objects = {name: getattr(kernels, name) for name in KERNELS}
    before = {name: compiled_binaries(k) for name, k in kernel_objects.items()}
    x = torch.randn(ROW_COUNTS[0], 128, device=DEVICE, dtype=torch.bfloat16)
    y, rstd = kernels.l2norm_fwd(x, EPS)
    kernels.l2norm_bwd(y, rstd, torch.randn_like(x))
    first = {name: compiled_binaries(k) for name, k in kernel_objects.items()}
    launch_at_row_counts()
    torch.cuda.synchronize()
    after = {name: compiled_binaries(k) for name, k in kernel_objects.items()}
    for name in kernel_objects:
        assert first[name] - before[name] <= 1, name
        assert after[name] == first[name], f"{name}: {after[name] - first[name]} extra binaries across {ROW_COUNTS}"


COMPILE_FOR_HOPPER = textwrap.dedent(
    """
    import inspect
    import json
    import sys

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile
    from triton.compiler.compiler import make_backend

    from gdn.backends.triton import l2norm as kernels

    target = GPUTarget("cuda", 90, 32)
    try:
        make_backend(target)
    except RuntimeError as exc:  # a Triton without the NVIDIA backend (triton-ascend)
        print(json.dumps({"skip": str(exc)}))
        sys.exit()
    runtime = {
        "_l2norm_fwd_kernel": dict(x_ptr="*bf16", y_ptr="*bf16", rstd_ptr="*fp32", rows="i32", eps="fp32"),
        "_l2norm_bwd_kernel": dict(y_ptr="*bf16", rstd_ptr="*fp32", dy_ptr="*bf16", dx_ptr="*bf16", rows="i32"),
    }
    results = {}
    for D in (100, 128, 1000):
        cfg = kernels.launch_config(D)
        constexprs = {"D": D, "BD": cfg["BD"], "BR": cfg["BR"]}
        for name, signature in runtime.items():
            kernel = getattr(kernels, name)
            signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
            if "constexprs" in inspect.signature(ASTSource).parameters:  # Triton >= 3.3: keyed by argument path
                params = list(inspect.signature(kernel.fn).parameters)
                source = ASTSource(kernel, signature, constexprs={(params.index(k),): v for k, v in constexprs.items()})
            else:
                source = ASTSource(kernel, signature, constants=constexprs)
            binary = compile(source, target=target, options={"num_warps": cfg["num_warps"]})
            results[f"{name}[D={D}]"] = {"cubin": len(binary.asm["cubin"]), "spills": ".local" in binary.asm["ptx"]}
    print(json.dumps(results))
    """
)


@pytest.mark.single_op
def test_kernels_compile_for_hopper():
    """The interpreter runs Python, not the compiler: compile both kernels for sm_90, PTX and cubin
    through the ptxas in the triton wheel (no GPU needed), and check nothing spills to local memory.
    In a fresh process without the interpreter: Triton 3.2's interpreter patches triton.language
    for the rest of the process, which breaks compiling there."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_FOR_HOPPER], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])
    if "skip" in results:
        pytest.skip(f"no CUDA compiler in this triton: {results['skip']}")
    assert len(results) == 6
    for name, result in results.items():
        assert result["cubin"] > 0, name
        assert not result["spills"], f"{name} spills to local memory"
