"""A job's privacy report: what its release lets the primary learn about each
secondary's records, measured by running linkage.attacks on that very release against the truth.

Only the holder of both parties' identifiers can score an attack: the linkage service (or the
in-process linker acting for it). The report holds no identifier, row or token, only rates and
counts, so the service hands it to the primary and to each secondary (about its own records).

    privacy_report(result, primary_ids (m, ..), secondary_ids {party: (n, ..)}, metric)
        -> {"job_id", "tau", "k", "metric", "defences", "success", "parties": {party: {...}}}

Per party: sigma and the noise it puts on a distance (identifier units), Theorem 1's epsilon at
that sigma, links per secondary record (median / p90 / max over the released tokens), and the
attacks' success on a seeded sample of up to ``max_tokens`` tokens:
- dictionary and membership (any metric): the share of tokens whose record the attacker names
  exactly, holding a dictionary that contains every true identifier (the strongest prior: a
  public register, or the shared encoding key plus such a register), from the token's released
  similarities and from which records link it (linkage.register_attacks; over the records that
  link an attacked token, a lower bound on the whole release's rate, in seconds);
- coordinates only (Euclidean, at most 3 dimensions): the paper's greedy attack, the aggregation attack (trilateration) and the
  links' centroid, each as the share of tokens located within the job's privacy radius
  (linkage.contracts.Defences; half an identifier unit by default), the event Theorem 2 bounds by
  tau for one distance (a location that close puts every distance to it within the radius), and
  its median error in identifier units.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from linkage.attacks import Released, aggregation_attack, greedy_attack, identifier_groups, released
from linkage.contracts import LinkageResult, PartyLink
from linkage.metrics import metric as metric_named
from linkage.register_attacks import dictionary_attack, membership_attack

MAX_TOKENS = 300  # tokens attacked per party: a seeded sample, so a report costs seconds
LOCATION_DIMS = 3  # numeric identifiers of at most this many columns may be locations (coordinates)


# Above this epsilon a DP bound says nothing a user can rely on (the literature's deployments stay
# at or below ~10; at 4e+08, a standard release's, an attacker's odds may move by e^(4e+08)).
USEFUL_EPSILON = 10.0


def _epsilon_text(eps: float | None) -> str:
    """Theorem 1's epsilon with what it means, for a report line."""
    if eps is None:
        return "none (no noise)"
    if eps > USEFUL_EPSILON:
        return f"{eps:.3g}: no useful differential-privacy guarantee (the attack rates are the protection)"
    return f"{eps:.3g} (differential privacy of each record's similarities, the paper's Theorem 1)"


def theorem1_epsilon(link: PartyLink) -> float | None:
    """Theorem 1's epsilon at the release's sigma: sigma = Delta_G / sqrt(2 eps), and dp_sigma is
    sigma at eps = 1, so eps = (dp_sigma / sigma)^2. None without noise (no DP guarantee)."""
    if link.sigma <= 0 or not math.isfinite(link.dp_sigma):
        return None
    return (link.dp_sigma / link.sigma) ** 2


def token_counts(link: PartyLink) -> np.ndarray:
    """(max token + 1,) links of each token in the release (0 for a token never released)."""
    return np.bincount(np.asarray(link.tokens, np.int64).ravel())


def sample_tokens(counts: np.ndarray, party: str, max_tokens: int, secret: bytes = b"") -> np.ndarray:
    """(T',) up to max_tokens of the released tokens (those with counts > 0), ascending. The draw
    is keyed by the job's secret (linkage.job_secret), which only the service holds: a sample the
    primary could compute from its release would tell it which records the report speaks for.
    Without a secret (a bare release, e.g. in a test), by the release itself."""
    tokens = np.flatnonzero(counts).astype(np.int64)
    if len(tokens) <= max_tokens:
        return tokens
    if secret:
        digest = hashlib.sha256(b"fedsim-privacy-sample|" + party.encode() + b"|" + bytes(secret)).digest()
        rng = np.random.default_rng(np.frombuffer(digest, dtype=np.uint32))
    else:
        digest = hashlib.sha256(b"privacy-report|" + party.encode() + b"|" + tokens.tobytes()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
    return np.sort(rng.choice(tokens, max_tokens, replace=False))


def attacked_tokens(
    counts: np.ndarray, party: str, row_of_token: np.ndarray, n_records: int, max_tokens: int, secret: bytes = b""
) -> np.ndarray:
    """(T',) the sampled tokens that stand for one of the party's n_records records (the Exact
    baseline's virtual "no match" row is no record)."""
    only = sample_tokens(counts, party, max_tokens, secret)
    return only[row_of_token[only] < n_records]


def rate_interval(rate: float, n: int, population: int, z: float = 1.96) -> list[float]:
    """A 95 % interval for a success rate measured on n tokens drawn without replacement from the
    population of attackable tokens: Wilson's score interval with the finite-population correction
    (the rate itself when every token was attacked)."""
    if n >= population:
        return [rate, rate]
    if n == 0:
        return [0.0, 1.0]
    ne = n * (population - 1) / (population - n)  # the effective size of a draw without replacement
    centre, half = rate + z * z / (2 * ne), z * math.sqrt(rate * (1 - rate) / ne + z * z / (4 * ne * ne))
    lo, hi = (centre - half) / (1 + z * z / ne), (centre + half) / (1 + z * z / ne)
    return [max(0.0, min(lo, rate)), min(1.0, max(hi, rate))]  # it holds the rate (not lost to rounding)


def link_counts(counts: np.ndarray) -> dict:
    """Links per released token (the primary can count them itself): median, p90, max."""
    counts = counts[counts > 0]
    return {
        "tokens": int(len(counts)),
        "median": float(np.median(counts)),
        "p90": float(np.percentile(counts, 90)),
        "max": int(counts.max()),
    }


def coordinate_attacks(
    link: PartyLink, primary_ids, truth_of_token: np.ndarray, only: np.ndarray, pre: Released | None = None
) -> dict:
    """The three location attacks on the sampled tokens: within the radius, median error. ``pre``:
    the release of those tokens, prepared once (linkage.attacks.released)."""
    pre = pre or released(link, primary_ids, only)
    guesses = {
        "greedy": greedy_attack(link, primary_ids, np.random.default_rng(19), only=only, pre=pre),
        "aggregation": aggregation_attack(link, primary_ids, only=only, pre=pre),
        "centroid": aggregation_attack(link, primary_ids, min_links=2**62, only=only, pre=pre),
    }
    out = {}
    for name, g in guesses.items():
        err = np.linalg.norm(g.location - truth_of_token[g.tokens], axis=1)  # (T',) identifier units
        out[name] = {"within_radius": float((err <= link.radius).mean()), "median_error": float(np.median(err))}
    return out


@dataclass(frozen=True)
class Attack:
    """How the report attacks a party: its identifiers' metric, at most ``max_tokens`` tokens
    attacked, sampled under the job's ``secret`` (:func:`sample_tokens`)."""

    metric: str
    max_tokens: int
    secret: bytes = b""


def party_report(
    result: LinkageResult, party: str, primary_ids, base, attack: Attack, counts: np.ndarray | None = None
) -> dict:
    """One secondary's entry of the report. ``counts``: the links of each token in the whole
    release, when ``result`` holds only some of its records (:func:`privacy_report`)."""
    metric = attack.metric
    link = result.primary.links[party]
    row_of_token = result.secondaries[party].row_of_token  # (n,) token -> that party's row
    base = np.asarray(base)
    counts = token_counts(link) if counts is None else counts
    only = attacked_tokens(counts, party, row_of_token, len(base), attack.max_tokens, attack.secret)
    population = int((row_of_token[np.flatnonzero(counts)] < len(base)).sum())  # every token a record stands behind
    entry = {
        "sigma": link.sigma,
        "noise_per_distance": link.sigma * link.sim_std,
        "radius": link.radius,
        "theorem1_epsilon": theorem1_epsilon(link),
        "links_per_record": link_counts(counts),
        "tokens_attacked": int(len(only)),
        "tokens_attackable": population,
    }
    if len(only) == 0:
        return entry | {"attacks": {}, "strongest": {"attack": "none", "rate": 0.0}}
    pre = released(link, primary_ids, only)  # the attacked tokens' pairs and counts, shared by every attack
    guess = dictionary_attack(link, primary_ids, base, metric, only=only, pre=pre)  # (T',) dictionary rows
    group = identifier_groups(base)  # a guess with the true identifier is a hit, duplicates included
    named = membership_attack(
        link, primary_ids, base, metric, only=only, pre=pre, linked_only=True
    )  # (T',) a lower bound
    truth = group[row_of_token[only]]
    attacks = {
        "dictionary": {"exact": float((group[guess] == truth).mean())},
        "membership": {"exact": float((group[named] == truth).mean())},
    }
    how = metric_named(metric)
    if how.coordinate_attacks(base):  # locations; the virtual row's truth (never attacked) clamped
        attacks |= coordinate_attacks(link, primary_ids, base[np.minimum(row_of_token, len(base) - 1)], only, pre)
    elif how.kind == "numbers" and base.ndim == 2 and base.shape[1] <= LOCATION_DIMS:
        entry["not_measured"] = (
            f"location attacks (greedy, trilateration, centroid: Euclidean geometry) on {metric}'s "
            f"{base.shape[1]}-dimensional identifiers, which may be locations"
        )
    for v in attacks.values():  # the rate first (strongest, report_lines read it), then its sampling error
        v["ci95"] = rate_interval(next(iter(v.values())), len(only), population)
    entry["attacks"] = attacks
    entry["strongest"] = strongest(attacks)
    return entry


def strongest(attacks: dict) -> dict:
    """The attack with the highest success rate, and that rate."""
    rates = {name: next(iter(v.values())) for name, v in attacks.items()}
    name = max(rates, key=rates.get)
    return {"attack": name, "rate": rates[name]}


def privacy_report(
    result: LinkageResult,
    primary_ids,
    secondary_ids: dict,
    metric: str,
    *,
    max_tokens: int = MAX_TOKENS,
    parties=None,
    counts: dict | None = None,
    secret: bytes = b"",
) -> dict:
    """The job's report (module docstring). primary_ids and secondary_ids as the job linked them
    (encoded, in private mode); metric: the job's. parties: those whose similarities are their
    own (a chain's: its anchor; default: all). ``counts`` {party: links per token}: given when
    ``result`` and ``primary_ids`` hold only the records linked to the attacked tokens (a release
    too big to hold: linkage_server.release_files); the report is the same as on the whole.
    ``secret``: the job's, which keys the sample of attacked tokens (:func:`sample_tokens`)."""
    counts, attack = counts or {}, Attack(metric, max_tokens, secret)
    parties = {
        p: party_report(result, p, primary_ids, secondary_ids[p], attack, counts.get(p))
        for p in sorted(parties or result.primary.links)
    }
    first = result.primary.links[min(result.primary.links)]
    return {
        "job_id": result.primary.job_id,
        "tau": result.primary.tau,
        "k": result.primary.k,
        "metric": metric,
        "defences": {"radius": first.radius, "compose": first.composed},
        "success": (
            "dictionary / membership: the record named exactly (from the similarities / from which records link the token); greedy / aggregation / centroid: located "
            f"within the radius {first.radius:g} (identifier units; Theorem 2's event); ci95: "
            "the rate's 95 % interval over the attackable tokens, of which a sample was attacked"
        ),
        "parties": parties,
    }


def safe_report(result: LinkageResult, primary_ids, secondary_ids: dict, metric: str, **options) -> dict:
    """:func:`privacy_report`, or, when an attack fails, a report that says so: the linkage it
    measures is already released and stays good (the report is a measurement, not the job)."""
    try:
        return privacy_report(result, primary_ids, secondary_ids, metric, **options)
    except Exception as e:  # noqa: BLE001 - any failure of a measurement, named in the report
        return failure_report(result, metric, e)


def failure_report(result: LinkageResult, metric: str, error: Exception) -> dict:
    """The report of a job whose attacks failed: the job's figures and why."""
    return {
        "job_id": result.primary.job_id,
        "tau": result.primary.tau,
        "k": result.primary.k,
        "metric": metric,
        "error": f"the attacks failed: {type(error).__name__}: {error}",
        "parties": {},
    }


def secondary_view(report: dict | None, party: str) -> dict | None:
    """What a secondary sees of the report: the job's tau and defences and the attacks' success
    on its own records, nothing of the job's statistics or of other parties (and the same shape
    whether or not its similarities were the ones released, as for a chain's non-anchors)."""
    if not report:
        return None
    own = report.get("parties", {}).get(party, {})
    entry = {"attacks": own.get("attacks", {}), "strongest": own.get("strongest")}
    protection = report.get("protection")
    if protection:  # its own floor and noise, none of another party's
        own_floor = protection.get("parties", {}).get(party)
        protection = {**protection, "parties": {party: own_floor} if own_floor else {}}
    return (
        {k: report[k] for k in ("job_id", "tau", "metric", "defences", "success", "error") if k in report}
        | {"parties": {party: entry}}
        | ({"protection": protection} if protection else {})
    )


def _interval(attack: dict) -> str:
    """ " (95 % CI lo-hi %)" for a sampled rate; "" for an exact one or an older report."""
    lo, hi = attack.get("ci95", (None, None))
    return "" if lo is None or lo == hi else f" (95 % CI {100 * lo:.1f}-{100 * hi:.1f} %)"


def protection_lines(protection: dict | None) -> list[str]:
    """The protection a job got (linkage.protection: each secondary's floor), as text lines."""
    if not protection:
        return []
    lines = [f"  protection: level {protection.get('level', '?')} (the secondaries' floors; docs/privacy.md)"]
    for party, p in sorted(protection.get("parties", {}).items()):
        draws = p["floor"].get("draws")
        lines.append(
            f"  {party}: noise on a distance >= {p['noise']:.4g} (spacing {p['spacing']:.4g}), radius "
            f"{p['radius']:.4g}, composed {p['compose']}, query draws per record "
            f"{'unbounded' if draws is None else f'<= {draws:g} x its links'}"
        )
    return lines


def report_lines(report: dict) -> list[str]:
    """The report as text lines (fedsim report, the run log)."""
    if report.get("error"):
        return [f"privacy: tau={report['tau']:g} K={report['k']}: not measured, {report['error']}"]
    lines = [
        f"privacy: tau={report['tau']:g} K={report['k']} metric={report['metric']} "
        f"radius={report['defences']['radius']:g} compose={report['defences']['compose']}"
    ] + protection_lines(report.get("protection"))
    for party, e in report["parties"].items():
        eps = e["theorem1_epsilon"]
        lc = e["links_per_record"]
        rates = ", ".join(
            f"{name} {100 * next(iter(v.values())):.1f} %{_interval(v)}" for name, v in e["attacks"].items()
        )
        lines.append(
            f"  {party}: sigma={e['sigma']:.4g} (noise per distance {e['noise_per_distance']:.4g}), "
            f"Theorem 1 epsilon={_epsilon_text(eps)}; links per record "
            f"median {lc['median']:g} / p90 {lc['p90']:g} / max {lc['max']}; attacks on "
            f"{e['tokens_attacked']} of {e.get('tokens_attackable', e['tokens_attacked'])} records: {rates}"
        )
        if e.get("not_measured"):
            lines.append(f"    not measured: {e['not_measured']}")
    return lines
