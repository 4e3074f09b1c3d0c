"""Expressions over an event's ``data``, for trigger filters Knative cannot express (eventing #8274).

A small, safe subset of Python expression syntax, parsed once with ``ast`` and evaluated by
walking the tree; nothing is ever passed to ``eval``. Allowed: literals, ``data.field.sub``
and ``data["key"]`` lookups (a missing field is ``None``), comparisons (``== != < <= > >=
in not in``), ``and``/``or``/``not``, and the functions ``len``, ``lower``, ``upper``,
``startswith``, ``endswith``, ``contains``. Example: ``data.size > 1000 and data.origin in
['minio', 'aws-s3']``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cascade.core.errors import InvalidInput

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: b is not None and a in b, ast.NotIn: lambda a, b: b is None or a not in b,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": lambda v: len(v) if v is not None else 0,
    "lower": lambda v: str(v).lower(), "upper": lambda v: str(v).upper(),
    "startswith": lambda v, p: isinstance(v, str) and v.startswith(p),
    "endswith": lambda v, s: isinstance(v, str) and v.endswith(s),
    "contains": lambda v, x: v is not None and x in v,
}


def _lookup(value: Any, key: Any) -> Any:
    if isinstance(value, dict):
        return value.get(key)
    if isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value):
        return value[key]
    return None


def _check(node: ast.AST, text: str) -> None:
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and child.id != "data" and child.id not in _FUNCTIONS:
            raise InvalidInput(f"unknown name {child.id!r} in {text!r}: use data.<field>", field="data")
        if isinstance(child, ast.Attribute) and child.attr.startswith("_"):
            raise InvalidInput(f"field names starting with '_' are not allowed in {text!r}", field="data")
        if isinstance(child, ast.Call) and not (isinstance(child.func, ast.Name) and child.func.id in _FUNCTIONS):
            raise InvalidInput(f"only {sorted(_FUNCTIONS)} may be called in {text!r}", field="data")
        allowed = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare,
                   ast.Name, ast.Load, ast.Attribute, ast.Subscript, ast.Constant, ast.List, ast.Tuple, ast.Call,
                   *_COMPARE)
        if not isinstance(child, allowed):
            raise InvalidInput(f"{type(child).__name__} is not allowed in filter expression {text!r}", field="data")


@dataclass(frozen=True)
class Expression:
    """A compiled data filter; ``matches(data)`` is False on any type error, never raises."""

    text: str
    tree: ast.Expression

    @classmethod
    def compile(cls, text: str) -> Expression:
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as exc:
            raise InvalidInput(f"filter expression {text!r} does not parse: {exc.msg}", field="data") from exc
        _check(tree, text)
        return cls(text, tree)

    def matches(self, data: Any) -> bool:
        try:
            return bool(self._eval(self.tree.body, data))
        except (TypeError, ValueError):
            return False

    def _eval(self, node: ast.AST, data: Any) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return data
        if isinstance(node, ast.Attribute):
            return _lookup(self._eval(node.value, data), node.attr)
        if isinstance(node, ast.Subscript):
            return _lookup(self._eval(node.value, data), self._eval(node.slice, data))
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self._eval(e, data) for e in node.elts]
        if isinstance(node, ast.BoolOp):
            values = (self._eval(v, data) for v in node.values)
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, data)
            return (not value) if isinstance(node.op, ast.Not) else -value
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, data)
            for op, comparator in zip(node.ops, node.comparators):
                right = self._eval(comparator, data)
                if left is None and not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    return False
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            return _FUNCTIONS[node.func.id](*(self._eval(a, data) for a in node.args))
        raise ValueError(type(node).__name__)
