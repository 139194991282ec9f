"""The resolved configuration that actors read.

Values are looked up by their `Key` declaration, which carries the type:

    from gateway.config.keys import heartbeat
    interval_ms = config[heartbeat.HEARTBEAT_BATCH_INTERVAL_MS]   # int, checked 100..60000

so a key added later needs no field here, and a typo in a key is an import error rather than
a missing attribute at runtime. `value_of("name")` serves the console and the docs, which
work by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import attrs

from gateway.config.schema import Key, Source

T = TypeVar("T")


def _frozen_mapping(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(values))


@attrs.frozen(eq=False)
class Config:
    """Every key of the section with its value and where the value came from."""

    values: Mapping[str, Any] = attrs.field(converter=_frozen_mapping)
    sources: Mapping[str, Source] = attrs.field(converter=_frozen_mapping)
    path: str = "<defaults>"

    def __getitem__(self, key: Key[T]) -> T:
        try:
            value: T = self.values[key.name]
        except KeyError:
            raise KeyError(f"{key.name} is not a key of this configuration") from None
        return value

    def value_of(self, name: str) -> Any:
        return self.values[name]

    def source_of(self, key: Key[Any]) -> Source:
        return self.sources[key.name]

    def with_value(self, key: Key[T], value: T, source: Source) -> Config:
        """A copy with one value replaced, for checks that adjust the resolved config."""
        if key.name not in self.values:
            raise KeyError(f"{key.name} is not a key of this configuration")
        return Config(
            values={**self.values, key.name: value},
            sources={**self.sources, key.name: source},
            path=self.path,
        )

    def __repr__(self) -> str:
        # Never the values: a repr ends up in crash reports and the console, and structured
        # keys will hold TLS paths. Which keys were set, and from where, is enough to debug
        # precedence.
        set_keys = ", ".join(
            f"{name}={src.value}" for name, src in self.sources.items() if src is not Source.DEFAULT
        )
        return f"Config(path={self.path!r}, set: {set_keys or 'nothing'}; the rest default)"
