"""Triggers: which events go to which subscriber, and how delivery retries (Knative's model).

A trigger has a name (its consumer group), a subscriber (a function name or an HTTP URL),
filters (Knative's ``exact``/``prefix``/``suffix``/``all``/``any``/``not`` over attributes,
ANDed, case-sensitive, plus ``data`` expressions, see ``cascade.events.expressions``), a delivery
spec (``retry``, ``backoffPolicy``, ``backoffDelay``, ``timeout``, ``deadLetterSink``) and an
ordering (``unordered`` with bounded ``concurrency``, or ``ordered`` per partition). Triggers
are declared in YAML: a function's ``func.yaml`` (``triggers:``) or a ``*.triggers.yaml`` file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cascade.core.errors import InvalidInput
from cascade.events.durations import seconds
from cascade.events.expressions import Expression

DIALECTS = ("exact", "prefix", "suffix", "all", "any", "not", "data")


class Filter(Protocol):
    def matches(self, attributes: Mapping[str, Any], data: Any) -> bool: ...


@dataclass(frozen=True)
class Exact:
    attributes: dict[str, str]

    def matches(self, attributes: Mapping[str, Any], data: Any) -> bool:
        return all(k in attributes and str(attributes[k]) == v for k, v in self.attributes.items())


@dataclass(frozen=True)
class Prefix:
    attributes: dict[str, str]

    def matches(self, attributes: Mapping[str, Any], data: Any) -> bool:
        return all(k in attributes and str(attributes[k]).startswith(v) for k, v in self.attributes.items())


@dataclass(frozen=True)
class Suffix:
    attributes: dict[str, str]

    def matches(self, attributes: Mapping[str, Any], data: Any) -> bool:
        return all(k in attributes and str(attributes[k]).endswith(v) for k, v in self.attributes.items())


@dataclass(frozen=True)
class All:
    filters: tuple[Filter, ...]

    def matches(self, attributes: Mapping[str, Any], data: Any) -> bool:
        return all(f.matches(attributes, data) for f in self.filters)


@dataclass(frozen=True)
class AnyOf:
    filters: tuple[Filter, ...]

    def matches(self, attributes: Mapping[str, Any], data: Any) -> bool:
        return any(f.matches(attributes, data) for f in self.filters)


@dataclass(frozen=True)
class Not:
    filter: Filter

    def matches(self, attributes: Mapping[str, Any], data: Any) -> bool:
        return not self.filter.matches(attributes, data)


@dataclass(frozen=True)
class DataExpression:
    expression: Expression

    def matches(self, attributes: Mapping[str, Any], data: Any) -> bool:
        return self.expression.matches(data)


def compile_filter(spec: Any, where: str = "filters") -> Filter:
    """One filter from its YAML form (a mapping with exactly one dialect key)."""
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in DIALECTS:
        raise InvalidInput(f"{where}: each filter is a mapping with one of {', '.join(DIALECTS)}", field=where)
    dialect, value = next(iter(spec.items()))
    if dialect in ("exact", "prefix", "suffix"):
        if not isinstance(value, dict) or not value:
            raise InvalidInput(f"{where}.{dialect}: map attribute names to strings", field=f"{where}.{dialect}")
        attrs = {str(k): str(v) for k, v in value.items()}
        kinds: dict[str, type[Exact] | type[Prefix] | type[Suffix]] = {"exact": Exact, "prefix": Prefix, "suffix": Suffix}
        return kinds[dialect](attrs)
    if dialect in ("all", "any"):
        if not isinstance(value, list):
            raise InvalidInput(f"{where}.{dialect}: a list of filters", field=f"{where}.{dialect}")
        subs = tuple(compile_filter(v, f"{where}.{dialect}[{i}]") for i, v in enumerate(value))
        return All(subs) if dialect == "all" else AnyOf(subs)
    if dialect == "not":
        return Not(compile_filter(value, f"{where}.not"))
    if not isinstance(value, str):
        raise InvalidInput(f"{where}.data: an expression string such as \"data.size > 10\"", field=f"{where}.data")
    return DataExpression(Expression.compile(value))


class Delivery(BaseModel):
    """Knative's delivery spec; defaults are the Kafka Broker's (retry 10, exponential, PT0.2S)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    retry: int = Field(10, ge=0)
    backoff_policy: Literal["linear", "exponential"] = Field("exponential", alias="backoffPolicy")
    backoff_delay: str = Field("PT0.2S", alias="backoffDelay")
    timeout: str = "PT30S"
    dead_letter_sink: str | None = Field(None, alias="deadLetterSink")

    @field_validator("backoff_delay", "timeout")
    @classmethod
    def _duration(cls, value: str) -> str:
        seconds(value)
        return value

    def delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (0 for the first): d*(n+1) linear, d*2^n exponential."""
        base = seconds(self.backoff_delay)
        return base * (retry + 1) if self.backoff_policy == "linear" else base * 2**retry

    @property
    def timeout_seconds(self) -> float:
        return seconds(self.timeout)

    def worst_case_seconds(self) -> float:
        """How long delivering one event can take, retries included."""
        return (self.retry + 1) * self.timeout_seconds + sum(self.delay(n) for n in range(self.retry))


class Trigger(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
    subscriber: str = Field(min_length=1, description="A function name or an http(s) URL.")
    broker: str = "default"
    filters: list[dict[str, Any]] = Field(default_factory=list)
    filter: dict[str, dict[str, str]] | None = Field(None, description="Legacy {attributes: {...}} exact filter.")
    delivery: Delivery = Field(default_factory=lambda: Delivery())
    ordering: Literal["unordered", "ordered"] = "unordered"
    concurrency: int = Field(16, ge=1, le=1024)
    start: Literal["latest", "earliest"] = "latest"

    @field_validator("filters")
    @classmethod
    def _compile(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, spec in enumerate(value):
            compile_filter(spec, f"filters[{i}]")
        return value

    @cached_property
    def matcher(self) -> Filter:
        filters = [compile_filter(f, f"filters[{i}]") for i, f in enumerate(self.filters)]
        if self.filter and self.filter.get("attributes"):
            filters.append(Exact({k: str(v) for k, v in self.filter["attributes"].items()}))
        return All(tuple(filters))

    def matches(self, attributes: Mapping[str, Any], data: Any) -> bool:
        return self.matcher.matches(attributes, data)

    def group(self, topic: str) -> str:
        """The consumer group, one per trigger and broker topic (platforms sharing a Kafka never mix)."""
        return f"{topic}.trigger.{self.name}"

    @property
    def dead_letter_topic(self) -> str:
        return self.delivery.dead_letter_sink or f"cascade.dlq.{self.name}"

    def retry_topic(self, topic: str) -> str:
        """Where replayed dead letters go: only this trigger consumes it."""
        return f"{topic}.retry.{self.name}"

    @property
    def is_url(self) -> bool:
        return self.subscriber.startswith(("http://", "https://"))


def parse_triggers(docs: Iterable[Any], source: str, default_subscriber: str | None = None) -> list[Trigger]:
    triggers = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise InvalidInput(f"{source}: trigger {i} must be a mapping", field=f"{source}#triggers[{i}]")
        if default_subscriber and "subscriber" not in doc:
            doc = {**doc, "subscriber": default_subscriber}
        try:
            triggers.append(Trigger.model_validate(doc))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InvalidInput(f"{source}: trigger {doc.get('name', i)}: {where}: {first['msg']}",
                               field=f"{source}#triggers[{i}].{where}") from None
    return triggers


def load_triggers(paths: Iterable[Path]) -> list[Trigger]:
    """Triggers from ``func.yaml`` files (subscriber defaults to the function) and ``*.triggers.yaml``."""
    found: dict[str, Trigger] = {}
    for root in paths:
        files = [root] if root.is_file() else sorted([*root.rglob("func.yaml"), *root.rglob("*.triggers.yaml")])
        for path in files:
            doc = yaml.safe_load(path.read_text()) or {}
            if path.name == "func.yaml":
                items, default = doc.get("triggers") or [], doc.get("name") or path.parent.name
            else:
                items, default = doc.get("triggers", doc) if isinstance(doc, dict) else doc, None
            for trigger in parse_triggers(items, str(path), default):
                if trigger.name in found:
                    raise InvalidInput(f"{path}: trigger name {trigger.name!r} is declared twice", field=str(path))
                found[trigger.name] = trigger
    return list(found.values())
