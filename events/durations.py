"""ISO-8601 durations (``PT0.2S``, ``PT30S``, ``PT1M30S``, ``P1D``) as Knative's delivery spec uses them."""

from __future__ import annotations

import re
from functools import lru_cache

from cascade.core.errors import InvalidInput

_ISO = re.compile(r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?"
                  r"(?:(?P<s>\d+(?:\.\d+)?)S)?)?$")


def seconds(text: str, field: str = "duration") -> float:
    """Seconds in an ISO-8601 duration; InvalidInput naming ``field`` otherwise."""
    parsed = _parsed(text) if isinstance(text, str) else None
    if parsed is None:
        raise InvalidInput(f"{field} {text!r} is not an ISO-8601 duration such as PT0.2S, PT30S or PT1M", field=field)
    return parsed


@lru_cache(maxsize=1024)  # a trigger's delivery spec is read per delivery
def _parsed(text: str) -> float | None:
    match = _ISO.match(text.strip())
    if not match or text.strip() in ("P", "PT") or text.strip().endswith("T"):
        return None
    parts = {k: float(v) if v else 0.0 for k, v in match.groupdict().items()}
    return parts["d"] * 86400 + parts["h"] * 3600 + parts["m"] * 60 + parts["s"]
