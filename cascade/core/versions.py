"""The one order of model versions, used by the registry, the edge agent, the CLI and the dashboard.

Numeric versions sort numerically (``2`` < ``10``) and after every non-numeric one (which
sort as text), so ``max(versions, key=version_key)`` is the newest numeric release.
"""

from __future__ import annotations


def version_key(version: object) -> tuple[int, int, str]:
    text = str(version)
    return (1, int(text), "") if text.isdigit() else (0, 0, text)
