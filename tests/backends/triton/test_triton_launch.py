"""Launching the bundled kernels through their binaries' launchers (gdn.backends.triton.launch): the
key that decides when a known binary is reused is at least as fine as Triton's specialization, the
launcher gets its arguments in its own order for both of Triton's signature conventions, and on a
CUDA device a direct launch computes what Triton's own launch computes, for every class of argument."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from gdn.backends.triton import launch as launching  # noqa: E402

pytestmark = pytest.mark.single_op
CUDA = torch.cuda.is_available()


@triton.jit
def _axpb_kernel(x, y, a, n, stride, BLOCK: tl.constexpr, SHIFT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    xv = tl.load(x + offs * stride, mask=mask, other=0.0).to(tl.float32)
    tl.store(y + offs, (xv * a + SHIFT).to(y.dtype.element_ty), mask=mask)


class _FakeKernel:
    """What the launch path reads of a JITFunction: its parameters and pre-run hooks."""

    def __init__(self, names: list[str], constexpr: set[str]):
        self.params = [SimpleNamespace(name=n, is_constexpr=n in constexpr) for n in names]
        self.pre_run_hooks: list = []


def test_arguments_triton_compiles_apart_have_keys_apart():
    kernel = _FakeKernel(["x"], set())

    def key(value):
        return launching._key(kernel, 0, (value,), {})

    base = torch.empty(64, dtype=torch.float32)
    assert key(base) != key(base[1:]), "a pointer off 16-byte alignment must not reuse an aligned binary"
    assert key(base) != key(base.to(torch.bfloat16)), "another dtype is another binary"
    assert key(base[4:]) == key(base) == key(torch.empty(8)), "16-byte aligned tensors of a dtype share it"
    assert key(torch.nn.Parameter(base)) == key(base), "a tensor subclass is keyed as a tensor"
    integers = [1, 2, 16, 2**31, -(2**31) - 1, -16]
    assert len({key(i) for i in integers}) == len(integers)
    assert len({key(1), key(True), key(1.0)}) == 3, "an integer, a flag and a float compile apart"
    assert key(None) != key(False)


def test_constants_are_keyed_by_identity_and_hold_no_tensors():
    kernel = _FakeKernel(["x", "n"], set())
    x = torch.empty(8)
    first, same_values = launching.Constants(BLOCK=64, num_warps=4), launching.Constants(BLOCK=64, num_warps=4)
    key = launching._key(kernel, 0, (x, 3), first.kwargs, first)
    assert key == launching._key(kernel, 0, (torch.empty(8), 3), first.kwargs, first)
    assert key != launching._key(kernel, 0, (x, 3), same_values.kwargs, same_values), "another object, another key"
    assert key != launching._key(kernel, 0, (x, 3), first.kwargs), "keywords passed one by one are keyed apart"
    with pytest.raises(TypeError, match=r"\['bias'\] are tensors"):
        launching.Constants(BLOCK=64, bias=x)


def test_constexprs_and_keywords_are_keyed_by_value_and_type():
    kernel = _FakeKernel(["x", "n", "BLOCK"], {"BLOCK"})
    x = torch.empty(8)
    one = launching._key(kernel, 0, (x, 3, 64), {"SHIFT": 1})
    assert one == launching._key(kernel, 0, (torch.empty(8), 3, 64), {"SHIFT": 1})
    assert one != launching._key(kernel, 0, (x, 3, 64), {"SHIFT": True}), "a flag is not the integer 1"
    assert one != launching._key(kernel, 0, (x, 3, 128), {"SHIFT": 1}), "a constexpr passed by position"
    assert one != launching._key(kernel, 0, (x, 3, 64), {"SHIFT": 2}), "a constexpr passed by keyword"
    assert one != launching._key(kernel, 1, (x, 3, 64), {"SHIFT": 1}), "another device"


@pytest.mark.parametrize(
    ("signature", "positions", "launched"),
    [
        # Triton 3.2: the binary's signature lists the runtime parameters only
        (["x", "y", "n", "IS_VARLEN"], (0, 1, 3), ("X", "Y", 7, 1)),
        # Triton 3.6 and 3.9: every parameter, constexprs included
        (["x", "y", "BLOCK", "n", "IS_VARLEN", "SHIFT"], None, ("X", "Y", 64, 7, 1, 3)),
    ],
    ids=["runtime-only", "every-parameter"],
)
def test_the_launcher_gets_its_arguments_in_its_own_order(signature, positions, launched, monkeypatch):
    kernel = _FakeKernel(["x", "y", "BLOCK", "n", "IS_VARLEN", "SHIFT"], {"BLOCK", "SHIFT"})
    hooks = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=SimpleNamespace(calls=[]))
    monkeypatch.setattr(launching, "_hook_source", lambda: hooks)
    monkeypatch.setattr(launching, "_stream_getter", lambda: lambda device: f"stream of {device}")
    launches, runs = [], []

    class Compiled:
        src = SimpleNamespace(signature=dict.fromkeys(signature, "any"))
        function, packed_metadata = "function", "metadata"

        def run(self, *values):  # Triton's launcher: grid, stream, function, metadata, hooks, arguments
            launches.append(values)

        def __getitem__(self, grid):  # Triton's own launch, which reads all three grid dimensions
            return lambda *values: runs.append(((grid[0], grid[1], grid[2]), values))

    args, kwargs = ("X", "Y", 64, 7), {"IS_VARLEN": 1, "SHIFT": 3, "num_warps": 4}
    binary = launching._binary(kernel, Compiled(), args, kwargs)
    assert binary is not None and binary.positions == positions
    for grid in [(2,), (2, 3), (2, 3, 4)]:
        binary.run(5, grid, args)
    prefix = ("stream of 5", "function", "metadata", None, None, None)
    assert launches == [(2, 1, 1, *prefix, *launched), (2, 3, 1, *prefix, *launched), (2, 3, 4, *prefix, *launched)]
    # a profiler's hook (Triton 3.2: a callable; 3.6: a chain with a call in it): its metadata comes
    # from the binary's own launch
    hooks.launch_exit_hook.calls.append(print)
    binary.run(5, (2,), args)
    hooks.launch_exit_hook.calls.clear()
    hooks.launch_enter_hook = print
    binary.run(5, (2, 3), args)
    assert runs == [((2, 1, 1), launched), ((2, 3, 1), launched)] and len(launches) == 3


def test_a_signature_that_needs_an_argument_the_call_did_not_pass_keeps_tritons_path():
    kernel = _FakeKernel(["x", "n", "SHIFT"], {"SHIFT"})
    compiled = SimpleNamespace(src=SimpleNamespace(signature={"x": "*fp32", "n": "i32", "SHIFT": "constexpr"}))
    assert launching._binary(kernel, compiled, ("X", 3), {}) is None


class _DirectPath:
    """A stand-in JITFunction on the direct launch path, on the host: `tritons_path` records each launch
    through Triton's own path (grid, args, kwargs), `launched` each launch through a binary's launcher,
    `hooked` each through a binary's own launch (grid, values), which runs a profiler's hooks (set
    them on `hooks`); the current device is `current[0]`."""

    def __init__(self, monkeypatch):
        self.tritons_path, self.launched, self.hooked, self.current = [], [], [], [0]
        record = self

        class Compiled:
            src = SimpleNamespace(signature=dict.fromkeys(["x", "n", "BLOCK", "SHIFT"], "any"))
            function, packed_metadata = "function", "metadata"

            def run(self, *values):
                record.launched.append(values)

            def __getitem__(self, grid):
                return lambda *values: record.hooked.append((grid, values))

        class FakeJIT(_FakeKernel):
            __name__ = "fake"

            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    record.tritons_path.append((grid, args, kwargs))
                    return Compiled()

                return run

        self.kernel = FakeJIT(["x", "n", "BLOCK", "SHIFT"], {"BLOCK", "SHIFT"})
        self.hooks = SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
        monkeypatch.setattr(launching, "direct_launches", lambda: True)
        monkeypatch.setattr(launching, "_jit_function", lambda: FakeJIT)
        monkeypatch.setattr(launching, "compiling_only", lambda: False)
        monkeypatch.setattr(launching, "_hook_source", lambda: self.hooks)
        monkeypatch.setattr(launching, "_stream_getter", lambda: lambda device: f"stream of {device}")
        monkeypatch.setattr(launching, "_binaries", {})
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current[0])


@pytest.mark.parametrize("with_constants", [False, True], ids=["keywords", "constants"])
def test_a_known_binary_is_launched_with_the_arguments_tritons_path_took(with_constants, monkeypatch):
    """The whole direct path on the host, with a stand-in for a JITFunction: Triton's path once per key,
    then the binary's launcher with the same arguments in its order, whether the keyword arguments come
    one by one or as Constants."""
    direct = _DirectPath(monkeypatch)
    kernel, tritons_path, launched = direct.kernel, direct.tritons_path, direct.launched
    x = torch.empty(8)
    keywords = {"BLOCK": 64, "SHIFT": 3, "num_warps": 4}
    constants = launching.Constants(**keywords)
    for n in (7, 7, 7, 9, 9):
        if with_constants:
            launching.launch(kernel, (2,), constants)(x, n)
        else:
            launching.launch(kernel, (2,))(x, n, **keywords)
    taken = [(grid, args[1], kwargs) for grid, args, kwargs in tritons_path]
    assert taken == [((2,), 7, keywords), ((2,), 9, keywords)], "Triton's path once per key"
    assert all(args[0] is x for _, args, _ in tritons_path)
    prefix = (2, 1, 1, "stream of 0", "function", "metadata", None, None, None)
    assert [(*values[:9], *values[10:]) for values in launched] == [(*prefix, 7, 64, 3)] * 2 + [(*prefix, 9, 64, 3)]
    assert all(values[9] is x for values in launched)
    with pytest.raises(TypeError, match="pass tensors by position"):
        launching.launch(kernel, (2,))(x, 7, **{**keywords, "SHIFT": x})
    assert len(tritons_path) == 2 and len(launching._binaries) == 2, "a refused launch neither runs nor stays"


def test_a_prepared_launch_finds_launchs_binaries_by_its_tensors_and_device(monkeypatch):
    """PreparedLaunch (a decode step's launch, its arguments after the tensors fixed, their dtypes too):
    Triton's path once per class of tensors (16-byte alignment), shared with `launch` under the same
    key; then the launcher with the same arguments, each tensor as its address (an integer, which
    Triton's launcher takes as the pointer without asking the driver), a launch hook with the tensors
    themselves; the tensors' device made current where it is not."""
    direct = _DirectPath(monkeypatch)
    kernel, tritons_path, launched, current = direct.kernel, direct.tritons_path, direct.launched, direct.current
    entered = []

    class Device:  # torch.cuda.device, on a host without one
        def __init__(self, device):
            self.index = device.index

        def __enter__(self):
            entered.append(self.index)
            self.previous, current[0] = current[0], self.index

        def __exit__(self, *exc):
            current[0] = self.previous

    monkeypatch.setattr(torch.cuda, "device", Device)
    constants = launching.Constants(BLOCK=64, SHIFT=3, num_warps=4)
    prepared = launching.PreparedLaunch(kernel, (2,), constants, (7,), torch.device("cuda", 0))
    x = torch.empty(64)
    classes = [x, x[4:], x[1:], x[2:]]  # aligned twice, off by 4 and 8 bytes
    for tensor in classes:
        prepared(tensor)
    assert [args[0] for _, args, _ in tritons_path] == [classes[0], classes[2], classes[3]]
    assert all(grid == (2, 1, 1) and args[1] == 7 for grid, args, _ in tritons_path)
    assert len(launched) == 1 and launched[0][:9] == (2, 1, 1, "stream of 0", "function", "metadata", None, None, None)
    assert type(launched[0][9]) is int and launched[0][9] == classes[1].data_ptr() and launched[0][10:] == (7, 64, 3)
    direct.hooks.launch_enter_hook = print  # a profiler's hook: the binary's own launch, given the tensors
    prepared(classes[1])
    assert len(launched) == 1 and direct.hooked == [((2, 1, 1), (classes[1], 7, 64, 3))]
    assert direct.hooked[0][1][0] is classes[1]
    direct.hooks.launch_enter_hook = None
    launching.launch(kernel, (2,), constants)(torch.empty(8), 7)  # launch's own path finds the binary
    assert len(tritons_path) == 3 and len(launched) == 2
    current[0] = 1  # another device is current: the tensors' is made current for the launch
    prepared(x)
    assert entered == [0] and current[0] == 1 and launched[-1][3] == "stream of 0" and len(tritons_path) == 3


@pytest.mark.skipif(not CUDA, reason="direct launches run on a CUDA device only")
def test_direct_launches_compute_what_tritons_launch_computes(gen):
    assert launching.direct_launches()
    launching._binaries.clear()
    x = torch.randn(4099, generator=gen).cuda()
    cases = [
        (x, 4099, 1),  # aligned, odd length
        (x, 4096, 1),  # a length divisible by 16
        (x[1:], 4098, 1),  # a pointer off 16-byte alignment
        (x.to(torch.bfloat16), 4099, 1),  # another dtype
        (x, 2049, 2),  # a stride of 2
        (x, 1, 1),  # one element: an integer Triton specializes as 1
    ]
    side = torch.cuda.Stream()
    constants = launching.Constants(BLOCK=256, SHIFT=3)
    for source, n, stride in cases:
        expected = (source[: (n - 1) * stride + 1 : stride].float() * 0.5 + 3).to(source.dtype)
        grid = (triton.cdiv(n, 256),)
        # prepared, the arguments after the tensors fixed: found under launch's key, then known to it
        # (its launcher given the tensors' addresses)
        prepared = launching.PreparedLaunch(_axpb_kernel, grid, constants, (0.5, n, stride), x.device)
        for repeat in range(5):
            stream = side if repeat == 2 else torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                # filled on the stream the kernel runs on: a fill on another stream could land after it
                y = torch.full((n,), float("nan"), device="cuda", dtype=source.dtype)
                if repeat == 1:  # the same binary, its keywords as one object
                    launching.launch(_axpb_kernel, grid, constants)(source, y, 0.5, n, stride)
                elif repeat >= 3:
                    prepared(source, y)
                else:
                    launching.launch(_axpb_kernel, grid)(source, y, 0.5, n, stride, BLOCK=256, SHIFT=3)
            torch.cuda.synchronize()
            torch.testing.assert_close(y, expected, rtol=0, atol=0)
        assert prepared._known, "the last launch took the prepared launch's own path"
    keys = [k for k in launching._binaries if k[0] is _axpb_kernel]
    assert len(keys) == 2 * len(cases), "each class of arguments, keywords or Constants, has a binary of its own"
    assert all(launching._binaries[k] is not None for k in keys)
    hooks = launching._binaries[keys[0]].hooks
    assert not launching._hooked(hooks.launch_enter_hook), "no profiler here: launches skip the hooks' metadata"
    assert not launching._hooked(hooks.launch_exit_hook)
