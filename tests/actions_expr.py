"""A small evaluator for the subset of the GitHub Actions expression language our workflows use in
`if:` conditions: string and number literals, true/false/null, context property paths, ==, !=, !,
&&, || and parentheses, and the status functions always(), success(), failure(), cancelled() (read
from the context's "status", "success" unless set), with GitHub's semantics (string comparison
ignores case; && and || return an operand). Anything else raises ValueError, so a test fails when a
condition outgrows it."""

from __future__ import annotations

import re
from typing import Any

TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<status>(?:always|success|failure|cancelled)\(\))"
    r"|(?P<op>==|!=|&&|\|\||!|\(|\))"
    r"|(?P<path>[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*))"
)


def _tokens(text: str) -> list[tuple[str, str]]:
    text = text.strip()
    if text.startswith("${{") and text.endswith("}}"):
        text = text[3:-2]
    out, pos = [], 0
    while pos < len(text.rstrip()):
        match = TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise ValueError(f"unsupported expression syntax at {text[pos:]!r}")
        kind = match.lastgroup
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "", -0.0)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return a == b


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]], context: dict[str, Any]):
        self.tokens, self.pos, self.context = tokens, 0, context

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def parse(self) -> Any:
        value = self.or_()
        if self.pos != len(self.tokens):
            raise ValueError(f"unexpected token {self.peek()!r}")
        return value

    def or_(self) -> Any:
        value = self.and_()
        while self.peek() == "||":
            self.take()
            right = self.and_()
            value = value if _truthy(value) else right
        return value

    def and_(self) -> Any:
        value = self.compare()
        while self.peek() == "&&":
            self.take()
            right = self.compare()
            value = right if _truthy(value) else value
        return value

    def compare(self) -> Any:
        value = self.unary()
        while self.peek() in ("==", "!="):
            op = self.take()[1]
            right = self.unary()
            value = _equal(value, right) if op == "==" else not _equal(value, right)
        return value

    def unary(self) -> Any:
        if self.peek() == "!":
            self.take()
            return not _truthy(self.unary())
        return self.atom()

    def atom(self) -> Any:
        kind, text = self.take()
        if text == "(":
            value = self.or_()
            if self.take()[1] != ")":
                raise ValueError("missing )")
            return value
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text)
        if kind == "status":
            status = self.context.get("status", "success")
            return text == "always()" or text == f"{status}()"
        if kind == "path":
            literal = {"true": True, "false": False, "null": None}
            if text in literal:
                return literal[text]
            value: Any = self.context
            for part in text.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            return value
        raise ValueError(f"unexpected token {text!r}")


def evaluate(expression: str, context: dict[str, Any]) -> Any:
    return _Parser(_tokens(expression), context).parse()
