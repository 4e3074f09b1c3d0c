"""Platform secrets by name: one rule for where a secret is read from and what it arrives as.

A secret ``hf-token`` is read locally from ``CASCADE_SECRET_HF_TOKEN`` and reaches a function
or a job as ``HF_TOKEN``; on a cluster it is the Secret ``hf-token`` (key ``value``). Functions
(``func.yaml#secrets``) and jobs (``spec.secrets``) name their secrets the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cascade.core.errors import InvalidInput

PREFIX = "CASCADE_SECRET_"


def var(name: str) -> str:
    """``hf-token`` -> ``HF_TOKEN``: the variable a secret arrives in."""
    return name.replace("-", "_").upper()


def resolve(names: Iterable[str], environ: Mapping[str, str], *, owner: str, field: str) -> dict[str, str]:
    """The named secrets from ``environ``, as the variables they arrive in; InvalidInput for one not set."""
    env = {}
    for name in names:
        source = PREFIX + var(name)
        if source not in environ:
            raise InvalidInput(f"{owner}: secret {name!r} is not set; export {source}=...", field=field)
        env[var(name)] = environ[source]
    return env


def secret_refs(names: Iterable[str]) -> list[dict[str, Any]]:
    """Kubernetes env entries that read each named secret from the Secret of that name (key ``value``)."""
    return [{"name": var(n), "valueFrom": {"secretKeyRef": {"name": n, "key": "value"}}} for n in names]
