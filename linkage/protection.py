"""Privacy levels and floors: the least protection a secondary accepts for its records, set by
that secondary (or the operator, for every secondary), never by the primary it protects against.

    LEVELS                                   "off" | "standard" | "strict"
    Floor.of_level(level)                    -> Floor: the level's protection, scaled by the data
    strictest(floor, ...)                    -> Floor: the most protective of each field
    spacing(ids (n, ..), metric)             -> float: the median distance to the nearest other record
    resolve(floors {party: Floor}, ids {party: (n, ..)}, metric, radius=0) -> Defences

A floor speaks in the identifiers' own scale: the least noise on a released distance is a share
of the secondary's nearest-neighbour *spacing* (plus, if the party states one, a least value in
identifier units); ``exact`` says whether a noise-free release is allowed; ``compose`` asks for
the noise on a link to be scaled by sqrt(the record's links), so that averaging a record's links
gains the primary about one draw; ``draws`` bounds the query similarities a primary may draw
against each record, in multiples of the links the record has in the release (with composed
noise a query draw to a record of n links is worth 1/n of a draw: ``draws`` = 1 lets queries
double what an attacker can average about a record; linkage_server.queries counts them).

Why these levels (docs/privacy.md "Privacy levels"): an attacker averaging N effective draws of
noise sigma_d on a distance localises a record to a median error of about 1.67 sigma_d / sqrt(N)
(the Cramer-Rao law the query-averaging attack followed, 2-D). "standard" puts sigma_d at one
spacing and N at most 2: a median error of ~1.2 spacings, above the bound of half a spacing (the
record's own Voronoi cell), and a register attack that must tell the record from neighbours one
noise sd away. "strict" doubles the noise and halves what queries may add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from linkage.contracts import Defences, LinkageError

LEVELS = ("off", "standard", "strict")
DEFAULT_LEVEL = "standard"
SPACING_SAMPLE = 2000  # records whose nearest neighbour measures the spacing (a stride through the table)
SPACING_K = 8  # neighbours looked at per sampled record: the nearest at a distance > 0 among them


@dataclass(frozen=True)
class Floor:
    """The least protection one secondary's records get (module docstring).

    spacing_share: least noise on a distance, in nearest-neighbour spacings (0 = none).
    noise: least noise on a distance, identifier units (0 = none); the larger of the two applies.
    exact: a noise-free release is allowed.
    compose: the noise on a link is scaled by sqrt(the record's links).
    draws: query similarities per record, in multiples of its links in the release (inf = unbounded).
    """

    spacing_share: float = 0.0
    noise: float = 0.0
    exact: bool = True
    compose: bool = False
    draws: float = math.inf

    def __post_init__(self) -> None:
        for name in ("spacing_share", "noise", "draws"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0):
                raise LinkageError(f"privacy floor {name!r} must be a number >= 0, got {value!r}")
        if math.isinf(self.spacing_share) or math.isinf(self.noise):
            raise LinkageError("a privacy floor's noise must be finite")
        if not self.exact and not self.noisy:
            raise LinkageError("a privacy floor that refuses an exact release must ask for some noise")

    @property
    def noisy(self) -> bool:
        return self.spacing_share > 0 or self.noise > 0

    @classmethod
    def of_level(cls, level: str) -> "Floor":
        """The named level's floor (off: today's exact release, queries bounded only by the job's budget)."""
        if level not in LEVELS:
            raise LinkageError(f"unknown privacy level {level!r}; known: {list(LEVELS)}")
        return {
            "off": cls(),
            "standard": cls(spacing_share=1.0, exact=False, compose=True, draws=1.0),
            "strict": cls(spacing_share=2.0, exact=False, compose=True, draws=0.5),
        }[level]

    def as_dict(self) -> dict:
        """JSON-safe (draws: None for unbounded)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return out | {"draws": None if math.isinf(self.draws) else self.draws}

    @classmethod
    def from_dict(cls, d: dict) -> "Floor":
        """What :meth:`as_dict` wrote, or a party's request: each field of its type, unknown ones refused."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise LinkageError(f"unknown privacy floor field(s) {unknown}; known: {sorted(known)}")
        values = dict(d)
        if values.get("draws", 0) is None:
            values["draws"] = math.inf
        for name in ("exact", "compose"):
            if name in values and not isinstance(values[name], bool):
                raise LinkageError(f"privacy floor {name!r} must be true or false, got {values[name]!r}")
        return cls(**values)


def strictest(*floors: Floor) -> Floor:
    """The floor that gives every record at least what each of ``floors`` asks."""
    if not floors:
        raise LinkageError("strictest() needs at least one floor")
    return Floor(
        spacing_share=max(f.spacing_share for f in floors),
        noise=max(f.noise for f in floors),
        exact=all(f.exact for f in floors),
        compose=any(f.compose for f in floors),
        draws=min(f.draws for f in floors),
    )


def spacing(ids, metric: str, party: str = "secondary") -> float:
    """The median distance (the metric's own) from a record to its nearest *other* record with
    different identifiers, over up to SPACING_SAMPLE records taken at a fixed stride (no random
    draw: the figure is a property of the table). 0 when every record has the same identifiers."""
    from linkage.search import searcher  # lazy: scipy, when a job runs

    ids = np.asarray(ids)
    n = len(ids)
    if n < 2:
        return 0.0
    sample = np.unique(np.linspace(0, n - 1, min(n, SPACING_SAMPLE)).astype(np.int64))
    dist, _ = searcher(ids, metric=metric, k=min(SPACING_K, n), party=party)(ids[sample])  # (s, k) ascending
    dist = np.where(dist > 0, dist, np.inf).min(axis=1)  # the nearest at a distance > 0
    dist = dist[np.isfinite(dist)]
    return float(np.median(dist)) if len(dist) else 0.0


def resolve(
    floors: dict[str, Floor], ids: dict, metric: str, *, radius: float = 0.0, compose: bool = False, tau: float = 1.0
) -> Defences:
    """The job's defences from each secondary's floor and its own identifiers: per party, the
    least noise on a distance (max of the floor's units and its share of the party's spacing) and
    the radius Theorem 2 and the attacks speak of (``radius`` when given, else half the party's
    spacing); composed when any floor or the primary asks. A party whose floor asks no noise, in
    a job with tau = 1, keeps the release of old (no spacing measured, the paper's radius 0.5)."""
    parties, spacings = [], {}
    for party in sorted(floors):
        floor = floors[party]
        if not floor.noisy and tau >= 1.0:
            continue
        s = spacings[party] = spacing(ids[party], metric, party)
        if s <= 0 and not (floor.noise and radius):
            raise LinkageError(
                f"party {party!r}: every record has the same identifiers, so there is no spacing to size "
                "its noise and radius by; state the noise (identifier units) and the privacy radius"
            )
        noise = max(floor.noise, floor.spacing_share * s)
        parties.append((party, float(noise), float(radius or s / 2)))
    return Defences(
        radius=radius or 0.5,
        compose=compose or any(f.compose for f in floors.values()),
        parties=tuple(parties),
        spacings=tuple(sorted(spacings.items())),
    )


def defences_from(d: dict | None, radius: float = 0.5, compose: bool = False) -> Defences:
    """The Defences a job recorded as a dict (job.json "defences"); without one (a job from
    before floors), the radius and compose it was started with."""
    if not d:
        return Defences(radius=radius or 0.5, compose=compose)
    return Defences(
        radius=d["radius"],
        compose=d["compose"],
        parties=tuple((p, float(n), float(r)) for p, n, r in d.get("parties", ())),
        spacings=tuple((p, float(s)) for p, s in d.get("spacings", ())),
    )


def chained(floors: dict[str, Floor], anchor: str) -> dict[str, Floor]:
    """A chain releases only its anchor's similarities, which every party shares: the anchor's
    floor is the strictest of all the parties'."""
    return {anchor: strictest(*floors.values())} if floors else {}


def record(levels: dict[str, str], floors: dict[str, Floor], defences: Defences) -> dict:
    """What a job's release records of the protection it got: per secondary the level it stated,
    its floor, spacing, least noise on a distance and radius (the release's sigma is in its links)."""
    spacings = dict(defences.spacings)
    named = sorted(set(levels.values()))
    return {
        "level": named[0] if len(named) == 1 else "per party",
        "parties": {
            p: {
                "level": levels.get(p, "custom"),
                "floor": floors[p].as_dict(),
                "spacing": spacings.get(p, 0.0),
                "noise": defences.noise_of(p),
                "radius": defences.radius_of(p),
                "compose": defences.compose,
            }
            for p in sorted(floors)
        },
    }


def described(floor: Floor) -> str:
    """One line naming what the floor asks (for refusals and logs)."""
    parts = []
    if floor.spacing_share:
        parts.append(f"noise >= {floor.spacing_share:g} x the nearest-neighbour spacing")
    if floor.noise:
        parts.append(f"noise >= {floor.noise:g} identifier units")
    parts.append("exact release allowed" if floor.exact else "no exact release")
    if floor.compose:
        parts.append("composed")
    if not math.isinf(floor.draws):
        parts.append(f"query draws <= {floor.draws:g} x each record's links")
    return ", ".join(parts)
