"""The one check of a JSON object against the dataclass it becomes (a record's parts, a run's
``run.json``, an evaluation's ``eval.json``): no key the class does not declare, none it
requires missing, each refusal naming the file and what to do."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any


def checked(cls: type, data: dict[str, Any], where: str, *, unknown: str,
            missing: str | None = None) -> dict[str, Any]:
    """``data`` if it fits ``cls``; else a ValueError naming ``where`` and the keys, then the
    remedy for ``unknown`` keys (or for ``missing`` ones, where it has its own)."""
    names = [f.name for f in fields(cls) if f.init]
    if extra := sorted(set(data) - set(names)):
        raise ValueError(f"{where}: unknown key(s) {extra}; {unknown}")
    required = [f.name for f in fields(cls) if f.init and f.name not in data
                and f.default is MISSING and f.default_factory is MISSING]
    if required:
        raise ValueError(f"{where}: lacks {required}" + (f"; {missing}" if missing else ""))
    return data
