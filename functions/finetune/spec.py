"""A fine-tuning spec with every default filled in: the defaults live in one place, the schema.

``schemas/finetunejob.v1.json`` declares each field's ``default``; the launcher, the memory
estimate, the local entrypoint and the cluster renderers all read the spec through
``with_defaults``, so a default changes in the schema and nowhere else.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from cascade.events import schemas


@cache
def defaults() -> dict[str, Any]:
    props = schemas.schema("finetunejob.v1")["properties"]
    return {name: field["default"] for name, field in props.items() if "default" in field}


def with_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` over the schema's defaults (a new dict; ``spec`` is not changed)."""
    return {**copy.deepcopy(defaults()), **{k: v for k, v in spec.items() if v is not None}}
