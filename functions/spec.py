"""A function's definition: ``func.yaml`` next to a Python module with ``handle(event)``.

```yaml
name: catalog-dataset
module: handler                # handler.py beside func.yaml; must define handle(event)
triggers: [...]                # the dispatcher's trigger model (events.triggers)
annotations:                   # Knative autoscaling annotations (serving.runtime.policy)
  autoscaling.knative.dev/min-scale: "0"
containerConcurrency: 0        # hard limit of requests per instance (0: unlimited)
resources: {accelerator: "0", cpu: "1", memory: 512Mi}
env: {LOG_LEVEL: info}
secrets: [hf-token]            # names; locally read from CASCADE_SECRET_<NAME> when present
idempotent: true               # handle each (source, id) once, even if delivered twice
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cascade.core.errors import InvalidInput
from cascade.events.triggers import Trigger, parse_triggers


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")
    accelerator: str = "0"
    cpu: str = "1"
    memory: str = "512Mi"


class FunctionSpec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    module: str = "handler"
    triggers: list[dict[str, Any]] = Field(default_factory=list)
    annotations: dict[str, str] = Field(default_factory=dict)
    container_concurrency: int = Field(0, alias="containerConcurrency", ge=0)
    resources: Resources = Field(default_factory=lambda: Resources())
    env: dict[str, str] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    idempotent: bool = True
    image: str | None = None
    path: Path = Field(default=Path("."), exclude=True)

    def trigger_models(self) -> list[Trigger]:
        return parse_triggers(self.triggers, str(self.path / "func.yaml"), self.name)


def load_function(directory: Path) -> FunctionSpec:
    """Read ``directory/func.yaml``; errors name the file and the field."""
    path = directory / "func.yaml"
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput(f"{path}: {exc}", field=str(path)) from exc
    if not isinstance(doc, dict):
        raise InvalidInput(f"{path}: must be a mapping", field=str(path))
    doc.setdefault("name", directory.name)
    doc["annotations"] = {str(k): str(v) for k, v in (doc.get("annotations") or {}).items()}
    try:
        spec = FunctionSpec.model_validate({**doc, "path": directory.resolve()})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"{path}: {where}: {first['msg']}", field=f"{path}#{where}") from None
    if not (directory / f"{spec.module.replace('.', '/')}.py").exists():
        raise InvalidInput(f"{path}: module {spec.module!r} not found ({spec.module}.py beside func.yaml)",
                           field=f"{path}#module")
    spec.trigger_models()  # validates the triggers now
    return spec


def discover(paths: list[Path]) -> list[FunctionSpec]:
    """Every function (a folder with func.yaml) under ``paths``."""
    found: dict[str, FunctionSpec] = {}
    for root in paths:
        if not root.exists():
            continue
        for func_yaml in sorted(root.rglob("func.yaml")):
            spec = load_function(func_yaml.parent)
            if spec.name in found:
                raise InvalidInput(f"function {spec.name!r} is defined twice ({found[spec.name].path}, {spec.path})")
            found[spec.name] = spec
    return list(found.values())
