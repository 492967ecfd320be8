"""The stand-in ops as their contracts (gdn.backends.ascendc.contracts) describe them.

`conforming(contract, kernel)` is the op a stand-in generation exposes: it refuses every call the
contract refuses (schema binding, host lists, dtypes, layouts, mutually exclusive pairs, shape
limits), hands the math kernel (standins.kernels_*) only what the real kernel reads (ignored inputs
are dropped), and shapes the result as the real op returns it: the contract's output dtypes and
layouts, and seeded garbage where the real op leaves an output uninitialised. Nothing about an op's
interface is written here; it all comes from the contract.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from gdn.backends.ascendc import contracts
from gdn.backends.ascendc.contracts import Contract

# the layouts the math kernels compute in; a contract that lays a tensor out otherwise is permuted
KERNEL_LAYOUTS = {"h": "B HV NT K V", "dh": "B HV NT K V"}


def _garbage(shape: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # what uninitialised device memory holds: large values, never the right answer
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(shape, generator=gen) * 1e4).to(device, dtype)


class Conforming:
    def __init__(self, contract: Contract, kernel: Callable):
        self.contract, self.kernel = contract, kernel
        self.__name__ = contract.op
        self.takes = set(inspect.signature(kernel).parameters)

    def _kernel_inputs(self, bound: dict[str, Any]) -> dict[str, Any]:
        c = self.contract
        inputs = {}
        for a in c.arguments:
            value = bound[a.name]
            if a.name in c.ignored:
                continue  # accepted, never read: the kernel computes as if it were absent
            if a.name not in self.takes:
                default = a.default_value if a.has_default_value() else None
                if value not in (None, default):
                    raise NotImplementedError(f"{c.op} stand-in: {a.name}={value!r} is not modelled")
                continue
            if a.name in KERNEL_LAYOUTS and isinstance(value, torch.Tensor):
                value = contracts.permute(value, c.layouts[a.name], KERNEL_LAYOUTS[a.name])
            inputs[a.name] = value
        return inputs

    def _output(self, spec: contracts.Output, value: Any, bound: dict[str, Any], dims: dict[str, int]) -> Any:
        c = self.contract
        present = spec.when is None or bound.get(spec.when) not in (None, False)
        if not present:
            return None
        if spec.name in c.uninitialised:
            shape = [int(s) if s.isdigit() else dims[s] for s in (spec.layout or "").split()]
            ref = next(t for t in bound.values() if isinstance(t, torch.Tensor))
            dtype = contracts.output_dtype(spec.dtype or "", bound) or ref.dtype
            return _garbage(shape, dtype, ref.device)
        if not isinstance(value, torch.Tensor):
            return value
        if spec.name in KERNEL_LAYOUTS and spec.layout:
            value = contracts.permute(value, KERNEL_LAYOUTS[spec.name], spec.layout)
        dtype = contracts.output_dtype(spec.dtype, bound) if spec.dtype else None
        return value if dtype is None else value.to(dtype)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        c = self.contract
        bound = contracts.check(c, args, kwargs)
        result = self.kernel(**self._kernel_inputs(bound))
        dims = contracts.chunk_symbols(bound)
        contracts.unify(c.op, c.layouts, bound, dims)
        if len(c.returns) == 1:
            return self._output(c.returns[0], result, bound, dims)
        if len(result) != len(c.returns):
            raise AssertionError(f"{c.op} stand-in returned {len(result)} outputs, its contract {len(c.returns)}")
        return tuple(self._output(s, v, bound, dims) for s, v in zip(c.returns, result, strict=True))


def conforming(route: str, op: str, kernel: Callable) -> Conforming:
    return Conforming(contracts.contract(route, op), kernel)
