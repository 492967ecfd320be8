"""The names of the built-in GDN ops, read from their declarations in gdn.calls without importing it
(it imports torch): configuration code lists the ops on machines without torch. A built-in op is an
`OpSpec(...)` there whose first argument is its name, a literal; the names come in declaration order.
An install without the sources (bytecode only) is refused here, on import, with the reason."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path


def _declared(source: str) -> tuple[str, ...]:
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "OpSpec"
    ]
    calls.sort(key=lambda node: (node.lineno, node.col_offset))
    names = []
    for node in calls:
        first = node.args[0] if node.args else None
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            raise ValueError(f"gdn.calls line {node.lineno}: expected an OpSpec whose first argument is its name")
        names.append(first.value)
    return tuple(names)


def _calls_names() -> tuple[str, ...]:
    spec = importlib.util.find_spec("gdn.calls")  # imports the gdn package only, which is torch-free
    if spec is None or spec.origin is None:
        raise ImportError("gdn.calls: the op declarations are not found")
    if not spec.origin.endswith(".py"):
        # the backends' declarations are read from their sources too, and Triton compiles the kernels
        # from theirs: without them gdn would list no backend
        raise ImportError(
            f"gdn needs its source files, and this install holds bytecode only ({spec.origin}): the ops and "
            "backends are declared in them and Triton compiles its kernels from them; reinstall gdn-matrix "
            "from its wheel or source"
        )
    return _declared(Path(spec.origin).read_text(encoding="utf-8"))


OP_NAMES = _calls_names()
