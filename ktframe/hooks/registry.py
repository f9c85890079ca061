"""Components looked up by kind and name, each remembering the plugin that provided it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ktframe.core.errors import PluginError, UnknownNameError
from ktframe.core.names import canonical, unknown_name_message


@dataclass(frozen=True)
class Provenance:
    """Where a registered thing came from."""

    plugin: str
    distribution: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        if self.distribution is None:
            return f"plugin {self.plugin!r}"
        return f"plugin {self.plugin!r} (distribution {self.distribution} {self.version or ''})".replace(" )", ")")


@dataclass(frozen=True)
class Entry:
    kind: str
    name: str
    obj: Any
    provenance: Provenance


class Registry:
    """A mapping ``kind -> name -> Entry`` filled by plugin hooks."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Entry]] = {}

    def add(self, entry: Entry) -> None:
        """Add ``entry``; a name already taken in its kind is an error naming both providers."""
        taken = self._entries.setdefault(entry.kind, {}).get(entry.name)
        if taken is not None:
            raise PluginError(
                f"{entry.kind} {entry.name!r} is registered twice: by {taken.provenance} and by "
                f"{entry.provenance}; uninstall one of them or rename the component"
            )
        self._entries[entry.kind][entry.name] = entry

    def get(self, kind: str, name: str) -> Any:
        """The object registered as ``name`` of ``kind``; an unknown name lists the valid ones."""
        return self.entry(kind, name).obj

    def entry(self, kind: str, name: str) -> Entry:
        """The entry of ``name`` (in any of its spellings, :func:`~ktframe.core.names.canonical`)."""
        entries = self._entries.get(kind, {})
        name = canonical(name)
        if not isinstance(name, str) or name not in entries:
            raise UnknownNameError(unknown_name_message(kind, str(name), list(entries)))
        return entries[name]

    def names(self, kind: str) -> list[str]:
        return sorted(self._entries.get(kind, {}))

    def kinds(self) -> list[str]:
        return sorted(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        for kind in self.kinds():
            yield from (self._entries[kind][name] for name in self.names(kind))
