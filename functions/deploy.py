"""Put functions on the local runtime: a FunctionSpec becomes a scale-to-zero service.

The function's Knative annotations become its scaling policy; its env, resolved secrets
and the state store URL (for effectively-once handling) become the instances' config.
"""

from __future__ import annotations

import os
from typing import Any

from cascade.core import secrets
from cascade.functions.spec import FunctionSpec
from cascade.serving.runtime.activator import Runtime
from cascade.serving.runtime.policy import ScalingPolicy
from cascade.serving.runtime.service import Service


def secret_env(spec: FunctionSpec) -> dict[str, str]:
    """Secrets by name, from ``CASCADE_SECRET_<NAME>`` (dashes as underscores, upper case)."""
    return secrets.resolve(spec.secrets, os.environ, owner=f"function {spec.name}",
                           field=f"{spec.path}/func.yaml#secrets")


def policy(spec: FunctionSpec, scale_to_zero_grace: float, defaults: dict[str, str] | None = None) -> ScalingPolicy:
    return ScalingPolicy.from_annotations({**(defaults or {}), **spec.annotations},
                                          container_concurrency=spec.container_concurrency,
                                          scale_to_zero_grace=scale_to_zero_grace)


def instance_config(spec: FunctionSpec, state_url: str) -> dict[str, Any]:
    return {"path": str(spec.path), "module": spec.module, "env": {**spec.env, **secret_env(spec)},
            "idempotent": spec.idempotent, "state_url": state_url}


def register(runtime: Runtime, spec: FunctionSpec, *, state_url: str, scale_to_zero_grace: float = 30.0,
             queue_timeout: float = 300.0, defaults: dict[str, str] | None = None) -> Service:
    """``defaults``: annotations for what the function leaves unset (the cluster's config-autoscaler)."""
    return runtime.add_function(spec.name, policy(spec, scale_to_zero_grace, defaults), instance_config(spec, state_url),
                                queue_timeout=queue_timeout)
