"""Kinds of ID: the registry, the only list of kinds.

Every tag has a kind (the ledger's ``kind`` column, the default kind's by
default). Each kind is one module of this package exporting ``SPEC``, a
``KindSpec`` (``interface.py``): its rules for the stores, its fields at tag add,
its policy, how it decodes and shows, and how a node makes its ``IdKind`` from a
``KindContext`` (``context.py``). The registry finds them here by itself: a new
kind is one new module, and the CLI, the admin API, decode and status take it
from ``SPECS`` (ARCHITECTURE.md, "A new kind of ID"; docs/kinds.md).

``segment`` (``segment.py``): ranges served from the node's buffers, with a
format rendered over them. ``strict`` (``strict.py``): one shared sequence per
tag, IDs in real-time order across nodes. ``snowflake`` (``snowflake.py``,
served by ``snowflake_leases.py``): IDs made in memory from a leased worker ID.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from idpool.pool.kind_rules import KindRules

from .context import KindContext
from .interface import Draft, IdKind, KeepsTags, KindSpec, NamedOnly, Stops, TakesFromMemory
from .segment import SegmentKind


def _discover() -> dict[str, KindSpec]:
    """Every module here with a ``SPEC``, listed by rank (the default kind first)."""
    found: list[KindSpec] = []
    for module in pkgutil.iter_modules(__path__):
        spec = getattr(importlib.import_module(f"{__name__}.{module.name}"), "SPEC", None)
        if isinstance(spec, KindSpec):
            found.append(spec)
    found.sort(key=lambda spec: (spec.rank, spec.name))
    return {spec.name: spec for spec in found}


SPECS: dict[str, KindSpec] = _discover()
# Every kind a tag may have: its name -> how a node makes its object (from SPECS)
KINDS: dict[str, Callable[[KindContext], IdKind]] = {n: s.make for n, s in SPECS.items()}
DEFAULT_KIND: str = next(name for name, spec in SPECS.items() if spec.default)


def spec_of(name: str) -> KindSpec:
    """The kind's spec; for a name no module here describes, every default."""
    spec = SPECS.get(name)
    return NamedOnly(name) if spec is None else spec


def rules_of(name: str) -> KindRules:
    """What the stores must know of the kind (pool/kind_rules.py)."""
    return spec_of(name).rules


def names(flag: Callable[[KindSpec], bool]) -> list[str]:
    """The kinds ``flag`` holds for, in the registry's order (for messages)."""
    return [name for name, spec in SPECS.items() if flag(spec)]


__all__ = [
    "DEFAULT_KIND",
    "Draft",
    "KINDS",
    "SPECS",
    "IdKind",
    "KeepsTags",
    "KindContext",
    "KindSpec",
    "SegmentKind",
    "Stops",
    "TakesFromMemory",
    "names",
    "rules_of",
    "spec_of",
]
