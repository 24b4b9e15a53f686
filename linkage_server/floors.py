"""Each secondary's privacy floor in a job (linkage.protection): the secondary states it at its
own ``link`` (``PUT /jobs/{job}/parties/{p}/floor``), the operator's (``serve --privacy-floor``)
raises every one, and the service enforces the strictest. The primary, the party the floors
protect against, cannot lower them: a start that explicitly asks for less (tau = 1, an exact
release, against a floor that refuses one) is refused by name; every other request is raised to
the floors (more noise still meets the primary's tau).

    parse_floor(body {"level", "spacing_share", "noise", "exact", "compose", "draws"}) -> (level, Floor)
    Floors(operator_level, operator: Floor)
    Floors.of(meta) -> {party: Floor}       what each secondary's records get (strictest of both)
    Floors.levels(meta) -> {party: level}   the level each stated (the operator's if none)
    Floors.check_start(meta, params)        422 naming the secondary whose floor a request breaks
"""

from __future__ import annotations

import math

from linkage.contracts import LinkageError
from linkage.protection import DEFAULT_LEVEL, LEVELS, Floor, described, strictest
from linkage.release import POOL_FACTOR
from linkage_server.params import JobError, JobParams

FIELDS = ("spacing_share", "noise", "exact", "compose", "draws")


def parse_floor(body) -> tuple[str, Floor]:
    """A secondary's floor as it sent it: a level (default "standard") and any field of
    :class:`Floor` to set in place of the level's (its own choice), each of its field's type."""
    if not isinstance(body, dict):
        raise JobError(422, "expected a JSON object {level, spacing_share, noise, exact, compose, draws}")
    unknown = sorted(set(body) - {"level", *FIELDS})
    if unknown:
        raise JobError(422, f"unknown privacy floor field(s) {unknown}; known: {['level', *FIELDS]}")
    level = body.get("level", DEFAULT_LEVEL)
    if level not in LEVELS:
        raise JobError(422, f"privacy level must be one of {list(LEVELS)}, got {level!r}")
    try:
        base = Floor.of_level(level).as_dict()
        return level, Floor.from_dict(base | {k: _number(k, v) for k, v in body.items() if k != "level"})
    except (LinkageError, TypeError) as e:
        raise JobError(422, str(e)) from None


def _number(name: str, value):
    """A field's value as sent: booleans for exact / compose, a finite number >= 0 (draws: or null)."""
    if name in ("exact", "compose"):
        return value
    if name == "draws" and value is None:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise JobError(422, f"privacy floor {name!r} must be a finite number, got {value!r}")
    return float(value)


class Floors:
    """The operator's floor and the rule that combines it with each secondary's."""

    def __init__(self, level: str = DEFAULT_LEVEL, floor: Floor | None = None) -> None:
        if level not in LEVELS:
            raise ValueError(f"the operator's privacy floor must be one of {list(LEVELS)}, got {level!r}")
        self.level, self.operator = level, floor or Floor.of_level(level)

    def of(self, meta: dict) -> dict[str, Floor]:
        """Each secondary's floor: the strictest of its own (the operator's if it stated none) and the operator's."""
        stated = meta.get("floors", {})
        return {
            p: strictest(self.operator, Floor.from_dict(stated[p]["floor"]) if p in stated else self.operator)
            for p in meta["secondaries"]
        }

    def levels(self, meta: dict) -> dict[str, str]:
        """The level each secondary stated (the operator's for one that stated none)."""
        stated = meta.get("floors", {})
        return {p: stated[p]["level"] if p in stated else self.level for p in meta["secondaries"]}

    def check_start(self, meta: dict, params: JobParams) -> dict[str, Floor]:
        """The floors, after refusing a request that explicitly asks for less than one of them."""
        floors = self.of(meta)
        if params.tau == 1.0:  # the primary asked for an exact release in so many words
            refusing = sorted(p for p, f in floors.items() if not f.exact)
            if refusing:
                p = refusing[0]
                raise JobError(
                    422,
                    f"secondary {p!r} does not allow an exact release of its records (tau = 1); its "
                    f"floor: {described(floors[p])}. Leave tau out (the floors then set the noise) "
                    "or ask for tau < 1",
                )
        noisy = sorted(p for p, f in floors.items() if f.noisy)
        if noisy and 0 < params.pool < POOL_FACTOR * params.k:
            raise JobError(
                422,
                f"secondary {noisy[0]!r}'s floor asks for noise; a pool of {params.pool} < {POOL_FACTOR} x K = "
                f"{POOL_FACTOR * params.k} candidates lets the released set go noise-free (the bisection attack, "
                'docs/privacy.md "Queries"); leave pool out or ask for at least that',
            )
        return floors
