"""JSON from clients, with a nesting limit.

``json.loads`` itself stops near 1,000 levels with a ``RecursionError`` (an HTTP 500 if
nobody catches it), and a document nested a few hundred levels deep parses fine but breaks
whatever walks it later (schema validation, the store, a page). Every body a client sends
goes through :func:`loads`: malformed or too deep is an :class:`InvalidInput` (HTTP 400).
"""

from __future__ import annotations

import json
from typing import Any

from cascade.core.errors import InvalidInput

MAX_DEPTH = 64


def depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and arrays more than ``limit`` levels deep (iterative)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if level > limit:
            return True
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return False


def check_depth(value: Any, field: str = "/", limit: int = MAX_DEPTH) -> Any:
    if depth_over(value, limit):
        raise InvalidInput(f"JSON nested more than {limit} levels deep", field=field)
    return value


def loads(body: bytes | str, field: str = "/", what: str = "body", limit: int = MAX_DEPTH) -> Any:
    """Parsed JSON; InvalidInput naming ``field`` when it is not JSON or nests too deep."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise InvalidInput(f"JSON nested more than {limit} levels deep", field=field) from None
    except ValueError as exc:
        raise InvalidInput(f"{what} is not JSON: {exc}", field=field) from exc
    opened = body.count(b"{") + body.count(b"[") if isinstance(body, bytes) else body.count("{") + body.count("[")
    if opened <= limit:  # no deeper than its brackets: most bodies are checked without walking them
        return value
    return check_depth(value, field, limit)
