"""Finding, loading and validating plugins, and building the component registry from them.

Built-in components are ordinary plugin modules registered first (as pytest does with its own
plugins); everything else comes from the ``ktframe`` entry-point group, loaded one entry point at a
time so that one broken plugin is reported while the others still load. Whatever a plugin raises
as it is imported, registered or called, an ``exit()`` (SystemExit) included, is such a failure;
only Ctrl-C (KeyboardInterrupt) goes through.

Environment:
- ``KTFRAME_STRICT_PLUGINS=1``: a plugin that fails to load or register is an error, not a warning.
- ``KTFRAME_DISABLE_PLUGINS=1`` (or a comma-separated list of entry-point names): skip those
  entry points; ``1`` (``ktframe --no-plugins``) skips every other distribution's plugins, while the
  built-in components and ktframe's own variants (entry points of the ktframe distribution) still load.

Both read ``0``, ``false``, ``no``, ``off`` and the empty string (any case) as off
(:mod:`ktframe.core.switches`); ``KTFRAME_DISABLE_PLUGINS`` takes ``1``, ``true``, ``yes``, ``on`` or
``all`` as every entry point and any other value as a list of names.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pluggy

from ktframe.core import switches
from ktframe.core.errors import PluginError
from ktframe.hooks import hookspecs
from ktframe.hooks.registry import Entry, Provenance, Registry
from ktframe.plugin.variant import Variant

ENTRY_POINT_GROUP = "ktframe"
FIRST_PARTY = "ktframe"  # the distribution whose entry points are its own variants
DISABLE_ENV = "KTFRAME_DISABLE_PLUGINS"
BUILTIN_PLUGINS = (
    "ktframe.components.scores",
    "ktframe.components.maps",
    "ktframe.components.norms",
    "ktframe.components.activations",
    "ktframe.components.embeddings",
    "ktframe.components.initializers",
)


class PluginLoadWarning(UserWarning):
    """A plugin could not be loaded or registered; the others were."""


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    distribution: str | None
    stage: str  # "import", "register" or a hook name
    error: str

    def __str__(self) -> str:
        where = f" from distribution {self.distribution}" if self.distribution else ""
        return f"plugin {self.plugin!r}{where} failed at {self.stage}: {self.error}"


@dataclass
class PluginInfo:
    name: str
    provenance: Provenance
    registers: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class PluginState:
    """Everything one round of plugin loading produced."""

    manager: pluggy.PluginManager
    registry: Registry
    plugins: list[PluginInfo]
    failures: list[PluginFailure]


def _disabled_entry_points() -> set[str] | bool:
    value = os.environ.get(DISABLE_ENV, "")
    if not switches.is_on(value):
        return set()
    if value.strip().lower() in ("1", "true", "yes", "on", "all"):
        return True
    return {part.strip() for part in value.split(",") if part.strip()}


def disabled() -> str:
    """What of the installed plugins is switched off, in words for an error message ("" if none)."""
    names = _disabled_entry_points()
    if names is True:
        return f"plugins of other distributions than ktframe are disabled (--no-plugins or {DISABLE_ENV})"
    return f"these installed plugins are disabled ({DISABLE_ENV}): {', '.join(sorted(names))}" if names else ""


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}".splitlines()[0] if text else type(exc).__name__


def _fail(failures: list[PluginFailure], failure: PluginFailure) -> None:
    if switches.on("KTFRAME_STRICT_PLUGINS"):
        raise PluginError(f"{failure} (KTFRAME_STRICT_PLUGINS is set)")
    failures.append(failure)
    warnings.warn(str(failure), PluginLoadWarning, stacklevel=3)


def _register(pm: pluggy.PluginManager, plugin: Any, provenance: Provenance, failures: list[PluginFailure]) -> bool:
    try:
        pm.register(plugin, name=provenance.plugin)
    except pluggy.PluginValidationError as exc:
        # A hookimpl whose signature does not match its spec: always an error, like pytest. pluggy's
        # message spans lines; the CLI prints errors on one.
        raise PluginError(f"{provenance} has an invalid hook: {'; '.join(str(exc).splitlines())}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of a foreign plugin is reported, not fatal (see _load_entry_points)
        if pm.get_plugin(provenance.plugin) is not None:  # pluggy names a plugin before it fails
            pm.unregister(name=provenance.plugin)
        _fail(failures, PluginFailure(provenance.plugin, provenance.distribution, "register", _error_text(exc)))
        return False
    return True


def _load_entry_points(pm: pluggy.PluginManager, provenances: dict[str, Provenance], failures: list[PluginFailure]) -> None:
    disabled = _disabled_entry_points()
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = ep.dist
        # Switched off as a whole, the installed plugins are those of other distributions: ktframe's
        # own variants are entry points like theirs, and ktframe without them could cluster nothing.
        if ep.name in disabled if disabled is not True else (dist is None or dist.name != FIRST_PARTY):
            continue
        provenance = Provenance(ep.name, dist.name if dist else None, dist.version if dist else None)
        if pm.get_plugin(ep.name) is not None:
            other = provenances.get(ep.name)
            raise PluginError(f"two plugins are named {ep.name!r}: {other} and {provenance}; uninstall one of them")
        try:
            plugin = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001
            # SystemExit too: a plugin that calls exit() as it is imported would otherwise end
            # every command, silently, with its code.
            _fail(failures, PluginFailure(ep.name, provenance.distribution, "import", _error_text(exc)))
            continue
        if _register(pm, plugin, provenance, failures):
            provenances[ep.name] = provenance


def _check_hook_names(pm: pluggy.PluginManager, provenances: dict[str, Provenance]) -> None:
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        known = ", ".join(sorted(hookspecs.KINDS))
        # pluggy names the plugin by its module; the distribution is what a user can uninstall.
        provenance = provenances.get(pm.get_name(exc.plugin) or "")
        where = f"{provenance} has an unknown hook: " if provenance else ""
        raise PluginError(f"{where}{exc} (known hooks: {known})") from None


def registrar(kind: str, provenance: Provenance, staged: list[Entry]) -> Callable[..., None]:
    """The ``register`` callback that a hook filling ``kind`` receives, appending to ``staged``:
    ``register(name, obj)`` for a component, ``register(variant)`` for a variant
    (:mod:`ktframe.hooks.hookspecs` says what each hook registers)."""

    def register(name: str, obj: Any) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"{provenance} registered a {kind} with an invalid name {name!r}; expected a non-empty string")
        staged.append(Entry(kind, name, obj, provenance))

    if kind != "variant":
        return register

    def register_variant(*args: Any) -> None:
        if len(args) not in (1, 2):
            raise PluginError(f"{provenance} called register() with {len(args)} arguments; a variant is registered as register(variant)")
        variant = args[-1]
        if not isinstance(variant, Variant):
            raise PluginError(f"{provenance} registered a {type(variant).__name__} as a variant; expected a ktframe.Variant")
        if len(args) == 2:  # the older register(name, variant): accepted while the names agree
            if args[0] != variant.name:
                raise PluginError(f"{provenance} registered the variant named {variant.name!r} as {args[0]!r}; call register(variant), which uses variant.name")
            warnings.warn(f"{provenance}: register(name, variant) is deprecated; call register(variant)", DeprecationWarning, stacklevel=2)
        register(variant.name, variant)

    return register_variant


def _fill_registry(pm: pluggy.PluginManager, provenances: dict[str, Provenance], failures: list[PluginFailure]) -> tuple[Registry, list[PluginInfo]]:
    """Call every registration hook of every plugin, one plugin at a time, built-ins first.

    A plugin's registrations are staged across all of its hooks and committed only when every one
    of them has returned, so a plugin that raises halfway leaves nothing of itself in the registry
    (not even what an earlier hook of it registered) and is not listed as loaded.
    """
    registry = Registry()
    infos: list[PluginInfo] = []
    # In registration order, not pluggy's last-registered-first call order, so that a clash names
    # the built-in (the earlier provider) first.
    for plugin_name, provenance in provenances.items():
        staged: list[Entry] = []
        hook_name = ""
        try:
            for hook_name, kind in hookspecs.KINDS.items():
                for impl in getattr(pm.hook, hook_name).get_hookimpls():
                    if impl.plugin_name != plugin_name:
                        continue
                    impl.function(register=registrar(kind, provenance, staged))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a plugin's own bug, invalid names or an exit() included, is reported
            _fail(failures, PluginFailure(plugin_name, provenance.distribution, hook_name, _error_text(exc)))
            pm.unregister(name=plugin_name)  # so that state.manager, like the registry, holds none of it
            continue
        info = PluginInfo(plugin_name, provenance)
        for entry in staged:
            registry.add(entry)
            info.registers.setdefault(entry.kind, []).append(entry.name)
        infos.append(info)
    return registry, infos


def load() -> PluginState:
    """Load built-in and installed plugins afresh and build their registry."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    version = metadata.version(FIRST_PARTY)
    provenances: dict[str, Provenance] = {}
    failures: list[PluginFailure] = []
    for module_name in BUILTIN_PLUGINS:
        provenance = Provenance(module_name, FIRST_PARTY, version)
        pm.register(importlib.import_module(module_name), name=module_name)
        provenances[module_name] = provenance
    _load_entry_points(pm, provenances, failures)
    _check_hook_names(pm, provenances)
    registry, infos = _fill_registry(pm, provenances, failures)
    return PluginState(pm, registry, infos, failures)


@lru_cache(maxsize=1)
def state() -> PluginState:
    """The plugin state of this process, loaded once."""
    return load()


def registry() -> Registry:
    return state().registry


def reset() -> None:
    """Forget the loaded plugins (tests and long-running hosts that install plugins at run time)."""
    state.cache_clear()


def disable_installed() -> None:
    """From now on load ktframe alone (its components and its own variants), no other distribution's plugin, in this process and
    in those it starts (the ranks Lightning's DDP launches inherit the environment)."""
    os.environ[DISABLE_ENV] = "1"
    reset()
