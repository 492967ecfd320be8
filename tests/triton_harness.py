"""What the triton backend's kernel tests share: the device and tolerances they compare on, a call to one
backend's implementation validated as the public op validates it, and the sm_90 compile harness
(`run_on_hopper_compiler`), which compiles launches in a fresh process without the interpreter, since
the interpreter never runs the compiler. Importing it imports no kernel: each test module sets
TRITON_INTERPRET (without a CUDA device) before its kernels are imported."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gdn import _validate
from gdn.calls import PREPARE

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def run(impl, op: str, *args, **kwargs):
    """Validate like the public op (the value checks held back, as the public op does for a kernel that
    guards the values), then call one backend's implementation directly."""
    with _validate.deferred_value_checks():
        call = PREPARE[op](*args, **kwargs)
    return impl(call)


SM90_HARNESS = '''
import inspect, json, re, subprocess, tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from triton.runtime.jit import JITFunction

DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
          torch.int64: "i64", torch.bool: "i1"}
try:  # the ptxas Triton itself picks for sm_90 (Triton >= 3.9 needs its newer one for its PTX)
    from triton.backends.nvidia.compiler import get_ptxas

    PTXAS = get_ptxas(90).path
except (ImportError, AttributeError, TypeError):
    PTXAS = None
RESULT = {}


class Recorder:
    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((args, kwargs))


def record(module, call):
    """{kernel name: [launch, ...]}: what call() launches of module's kernels, none of them run."""
    kernels = {name: k for name, k in vars(module).items() if isinstance(k, JITFunction)}
    recorders = {name: Recorder() for name in kernels}
    for name, recorder in recorders.items():
        setattr(module, name, recorder)
    try:
        call()
    finally:
        for name, kernel in kernels.items():
            setattr(module, name, kernel)
    return {name: [(kernels[name], *launch) for launch in r.launches] for name, r in recorders.items()}


def specialize(kernel, args, kwargs):
    """Signature, constants, attributes and options as a GPU launch specializes them: tensors and
    ints divisible by 16 get tt.divisibility, ints equal to 1 become constants, except parameters
    marked do_not_specialize."""
    bound = inspect.signature(kernel.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in kernel.arg_names})
    options = {k: v for k, v in kwargs.items() if k not in kernel.arg_names}
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(kernel.params):
        value = bound.arguments[p.name]
        if p.is_constexpr or value is None or (type(value) is int and value == 1 and not p.do_not_specialize):
            signature[p.name], constexprs[p.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[p.name] = "*" + DTYPES[value.dtype]
            if value.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[p.name] = "fp32"
        else:
            signature[p.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0 and not p.do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs, options


def launch_key(launch):
    return repr(specialize(*launch))


def compile_sm90(launch):
    """Compiles for sm_90; returns ptxas's register count and spill bytes (None without ptxas) and the
    shared memory a block needs."""
    signature, constexprs, attrs, options = specialize(*launch)
    source = ASTSource(launch[0], signature, constexprs=constexprs, attrs=attrs)
    binary = compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    # fp32 adds of a literal zero: ptxas keeps each (0 + -0.0 is +0.0), one instruction a state element
    zero_adds = len(re.findall(r"add\\.f32\\s+%r\\d+, (?:%r\\d+, 0f00000000|0f00000000, %r\\d+);", binary.asm["ptx"]))
    if PTXAS is None:
        return {"registers": None, "spill_bytes": None, "shared": binary.metadata.shared, "zero_adds": zero_adds}
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(binary.asm["ptx"])
        cmd = [PTXAS, "-arch=sm_90a", "-v", str(ptx), "-o", str(Path(tmp) / "kernel.cubin")]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    return {
        "registers": int(re.search(r"Used (\\d+) registers", log).group(1)),
        "spill_bytes": int(re.search(r"(\\d+) bytes spill stores", log).group(1)),
        "shared": binary.metadata.shared,  # bytes a block asks for: a launch past the SM's fails
        "zero_adds": zero_adds,
    }
'''


def run_on_hopper_compiler(scenario: str) -> dict:
    """Runs SM90_HARNESS + scenario in a fresh interpreter without TRITON_INTERPRET (so that the
    kernels are real JIT functions); the scenario fills RESULT, which comes back as JSON."""
    import triton.compiler

    if importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("no CUDA compiler in this triton (triton-ascend)")
    if "constexprs" not in inspect.signature(triton.compiler.ASTSource).parameters:
        pytest.skip("Triton < 3.3 takes another ASTSource signature")
    script = SM90_HARNESS + textwrap.dedent(scenario) + "\nprint(json.dumps(RESULT))\n"
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])
