"""The linkage library's contract: what a job takes (metrics), what it releases to each party
(:class:`PrimaryLinkage`, :class:`SecondaryLinkage`), and its error. Every other package that
consumes a linkage (strategies/, app/, the service) imports these types from here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from linkage.errors import LinkageError  # noqa: F401 - re-exported: every package imports it from here

# the metrics' names, from their registry (linkage.metrics: one object per metric), re-exported
from linkage.metrics import DEFAULT_STRING_METRIC, METRICS, STRING_METRICS  # noqa: F401

MAX_ABS_NUMBER = 1e100  # a number a party's CSV or upload may hold: squared distances and sums must stay finite
CSV_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")  # a number as a CSV writes one: no '_', no inf
PARTY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # whole names only: PARTY_NAME.fullmatch


def party_names_problem(names: list) -> str | None:
    """What is wrong with ``names`` as one federation's party names (a job's, a parties.toml's),
    None when nothing is: each names the party's files, so one plain name (PARTY_NAME), and they
    are distinct ignoring case (one file per party on any filesystem)."""
    for name in names:
        if not isinstance(name, str) or not PARTY_NAME.fullmatch(name):
            return f"bad party name {name!r}: use 1-64 letters, digits, '_', '-', '.'"
    if len({n.lower() for n in names}) != len(names):
        return f"party names must be distinct, ignoring case; got {list(names)}"
    return None


@dataclass(frozen=True)
class PartyLink:
    """What the primary holds about one secondary party.

    tokens: (m, K) int64 opaque ids of that party's records (not row numbers).
    sims:   (m, K) float32 standardised (and possibly noised) similarities, descending per row.
    """

    tokens: np.ndarray
    sims: np.ndarray
    sigma: float
    sim_mean: float
    sim_std: float
    dp_sigma: float = float("nan")  # Theorem 1's (eps=1)-DP noise scale for the same job, for reference
    radius: float = 0.5  # Theorem 2's success radius in identifier units (a distance guessed within it)
    composed: bool = False  # noise on a link to a record scaled by sqrt(that record's links): Defences
    recall: float = 1.0  # tie-aware recall of the top-K search on a sample (1 = exact; linkage.approx)


@dataclass(frozen=True)
class Defences:
    """How a job calibrates its noise against the attacks of linkage/attacks.py.

    radius: Theorem 2 counts a distance guessed within ``radius`` (identifier units) as the
            attacker's success; the paper's half a unit is 0.5. On coordinates in degrees 0.5 is
            55 km and no tau < 1 is reachable; radius = 0.001 (about 111 m) makes tau speak of
            that distance. sigma = noise.sigma_from_tau(tau, raw_std, radius).
    compose: the noise on each released similarity to a secondary record is sigma * sqrt(n),
            n = the primary records linked to that record (at least 1): n draws averaged (or
            trilaterated) are then about as informative as one draw at sigma, the case Theorem 2
            bounds. Needs pool = K (the links are known before the noise).
    """

    radius: float = 0.5
    compose: bool = False
    # per secondary, from its privacy floor (linkage.protection.resolve): (party, the least noise
    # on a distance in identifier units, the radius its attacks count success within)
    parties: tuple[tuple[str, float, float], ...] = ()
    spacings: tuple[tuple[str, float], ...] = ()  # each floored party's nearest-neighbour spacing (reported)

    def __post_init__(self) -> None:
        if not (self.radius > 0 and self.radius < float("inf")):
            raise LinkageError(f"the privacy radius must be a positive number, got {self.radius!r}")
        for party, noise, radius in self.parties:
            if not (0 <= noise < float("inf") and 0 < radius < float("inf")):
                raise LinkageError(f"party {party!r}: noise {noise!r} and radius {radius!r} must be finite, radius > 0")

    @property
    def noisy(self) -> bool:
        """Some party's floor asks for noise, whatever tau (the pool is then linkage.release's noisy one)."""
        return any(noise > 0 for _, noise, _ in self.parties)

    def noise_of(self, party: str) -> float:
        """The least noise on a distance to this party's records, identifier units (0: none asked)."""
        return next((noise for p, noise, _ in self.parties if p == party), 0.0)

    def radius_of(self, party: str) -> float:
        """The radius Theorem 2 and the attacks speak of for this party's records."""
        return next((radius for p, _, radius in self.parties if p == party), self.radius)

    def tag(self) -> str:
        """Their part of a job's content id: '' for the defaults (ids of earlier jobs unchanged)."""
        floors = "".join(f"|{p}:noise={n!r},radius={r!r}" for p, n, r in self.parties)
        return (
            ("" if self.radius == 0.5 else f"|radius={self.radius!r}") + ("|compose" if self.compose else "") + floors
        )


@dataclass(frozen=True)
class PrimaryLinkage:
    """What the primary party receives: per record and per secondary K (token, similarity) pairs."""

    job_id: str
    k: int
    tau: float
    links: dict[str, PartyLink]
    metric: str = "euclidean"
    # "independent": each secondary linked to the primary on its own (its own tokens and sims);
    # "chain": paper App. C, the secondaries linked one-to-one among themselves and the primary
    # linked top-K to that chain, so every party's k-th neighbour shares one similarity.
    layout: str = "independent"
    # SHA-256 of the primary identifiers the job linked (linkage.binding.identifier_digest):
    # a run binds a fetched linkage to its own identifiers by it; "" = not recorded
    ids_sha256: str = ""

    @property
    def shared_sims(self) -> bool:
        """One similarity per (record, neighbour) for all parties: one party, or a chain."""
        return len(self.links) == 1 or self.layout == "chain"

    @property
    def tokens(self) -> dict[str, np.ndarray]:
        return {p: link.tokens for p, link in self.links.items()}

    def _only(self) -> PartyLink:
        if not self.shared_sims:
            raise LinkageError(
                f"this linkage has {len(self.links)} independently linked secondaries {sorted(self.links)}; "
                "ask for one party's similarities with .links[party]"
            )
        return self.links[min(self.links)]

    @property
    def sims(self) -> np.ndarray:
        return self._only().sims

    @property
    def sigma(self) -> float:
        return self._only().sigma

    @property
    def sim_mean(self) -> float:
        return self._only().sim_mean

    @property
    def sim_std(self) -> float:
        return self._only().sim_std


@dataclass(frozen=True)
class SecondaryLinkage:
    """What a secondary party receives: row_of_token[token] = its own row number."""

    job_id: str
    party: str
    row_of_token: np.ndarray


@dataclass(frozen=True)
class LinkageResult:
    primary: PrimaryLinkage
    secondaries: dict[str, SecondaryLinkage] = field(default_factory=dict)


def identifier_bytes(arr: np.ndarray) -> bytes:
    """Numbers as float64 (ids of int and float copies agree), strings length-prefixed (no two
    lists share bytes), bits as they are."""
    if arr.dtype.kind in "UO":
        return b"".join(len(b).to_bytes(8, "little") + b for b in (str(x).encode() for x in arr.ravel()))
    if arr.dtype == np.uint8:
        return arr.tobytes()
    return arr.astype(np.float64).tobytes()
