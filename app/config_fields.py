"""One home for each run-config key: its field in a typed group (app/config_groups.py) carries its
default, its help line and what a checkpoint needs to know of it (and the groups' shared checks). pyproject.toml's
``[tool.flwr.app.config]`` table is rendered from these fields (app/config_table.py) and a test
keeps the file equal to the rendering."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

HELP, MAY_CHANGE, BEFORE = "help", "may_change", "before"
_NO_BEFORE = object()
Need = Callable[[bool, str], None]  # a group's check: need(condition, the refusal naming the key)


def opt(default: object, help: str, *, may_change: bool = False, before: object = _NO_BEFORE) -> dataclasses.Field:
    """A run-config field: ``default``; ``help``, one line for the key's table; ``may_change``: it
    may differ between a run and its resumption (paths, patience, bookkeeping); ``before``: the
    value runs had before the key existed (a checkpoint written then resumes with it)."""
    meta = {HELP: help, MAY_CHANGE: may_change}
    if before is not _NO_BEFORE:
        meta[BEFORE] = before
    return dataclasses.field(default=default, metadata=meta)


def nonnegative(need: Need, group, *names: str) -> None:
    """Each of the group's fields ``names`` must be >= 0, refused naming its key."""
    for name in names:
        value = getattr(group, name)
        need(value >= 0, f"run-config {name.replace('_', '-')!r} must be >= 0, got {value}")
