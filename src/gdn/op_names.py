"""The names of the built-in GDN ops, read from their declarations in gdn.calls without importing it
(it imports torch): configuration code lists the ops on machines without torch. A built-in op is an
`OpSpec(...)` there whose first argument is its name, a literal; the names come in declaration order."""

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


def _calls_source() -> str:
    spec = importlib.util.find_spec("gdn.calls")  # imports the gdn package only, which is torch-free
    if spec is None or spec.origin is None:
        raise ImportError("gdn.calls: the op declarations are not found")
    return Path(spec.origin).read_text(encoding="utf-8")


OP_NAMES = _declared(_calls_source())
