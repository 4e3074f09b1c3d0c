"""The security context every pod Cascade renders runs with (Kubernetes' "restricted" profile).

Non-root, no privilege escalation, every capability dropped, the runtime's default seccomp
profile. Container-level, because Knative admits only container ``securityContext`` fields by
default; the same fields at the pod level where the workload kind allows them.
"""

from __future__ import annotations

from typing import Any


def container() -> dict[str, Any]:
    return {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def pod() -> dict[str, Any]:
    return {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
