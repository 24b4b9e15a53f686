"""The dictionary attack and the per-job privacy report (linkage/attacks.py, linkage/privacy.py,
issue 19) on planted identifiers linked by the real pipeline: without noise the attack names
every planted record (coordinates, strings, keyed Bloom filters), its success falls as tau
falls, and the report reaches the run's summary.json and `fedsim report`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from linkage.attacks import identifier_groups
from linkage.contracts import LinkageError
from linkage.encode import encode_with_key
from linkage.pipeline import link
from linkage.privacy import privacy_report, report_lines
from linkage.register_attacks import dictionary_attack, membership_attack
from linkage.store import PRIVACY, load_privacy, save_privacy

SECRET = b"privacy-report-test-secret-0123456789"


def coordinates(seed: int, m: int = 400, n: int = 60, scale: float = 100.0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, scale, (m, 2)), rng.uniform(0, scale, (n, 2))


def names(seed: int, m: int = 300, n: int = 80):
    """(m,) primary and (n,) secondary strings: each primary name a typo'd copy of a secondary one."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    base = np.array(["".join(rng.choice(letters, rng.integers(8, 14))) for _ in range(n)], dtype=object)
    src = base[rng.integers(0, n, m)]
    typo = [s[:i] + rng.choice(letters) + s[i + 1 :] for s, i in zip(src, rng.integers(0, 8, m))]
    return np.array(typo, dtype=object), base


def hit_rate(result, primary, base, metric: str) -> float:
    """The dictionary attack's exact-match rate over every released token."""
    party_link = result.primary.links["s"]
    guess = dictionary_attack(party_link, primary, base, metric)  # (T,) dictionary rows, tokens ascending
    tokens = np.unique(party_link.tokens)
    group = identifier_groups(base)
    return float((group[guess] == group[result.secondaries["s"].row_of_token[tokens]]).mean())


@pytest.mark.parametrize("kind", ["coordinates", "strings", "bloom"])
def test_the_dictionary_attack_names_every_planted_record_without_noise(kind):
    if kind == "coordinates":
        primary, base, metric = *coordinates(0), "euclidean"
    else:
        primary, base = names(1)
        metric = "qgram_cosine"
        if kind == "bloom":  # private mode: the attacker holds the parties' key, so it encodes its dictionary
            key = {"secret": b"the-parties-shared-key-0123456789"}
            primary, base, metric = encode_with_key(primary, key), encode_with_key(base, key), "hamming"
    result = link(primary, {"s": base}, k=5, tau=1.0, secret=SECRET, metric=metric)
    assert hit_rate(result, primary, base, metric) == 1.0


def test_the_dictionary_attack_fails_more_as_tau_falls_yet_beats_the_bound():
    primary, base = coordinates(2, m=600, n=150, scale=200.0)  # units where Theorem 2 can add noise
    taus = (1.0, 0.1, 0.05)
    rates = [
        hit_rate(link(primary, {"s": base}, k=8, tau=tau, secret=SECRET), primary, base, "euclidean") for tau in taus
    ]
    assert rates[0] == 1.0 and rates[2] < 0.5 < rates[1], rates  # measured: 1.0, 0.97, 0.33
    assert rates[1] > 5 * taus[1]  # Theorem 2 bounds one guessed distance, not a record named from all of them


def test_the_report_measures_the_release_and_holds_no_identifier():
    primary, base = coordinates(3, m=500, n=100, scale=200.0)
    quiet = link(primary, {"s": base}, k=8, tau=1.0, secret=SECRET)
    noisy = link(primary, {"s": base}, k=8, tau=0.05, secret=SECRET)
    a, b = (privacy_report(r, primary, {"s": base}, "euclidean", max_tokens=40) for r in (quiet, noisy))
    ea, eb = a["parties"]["s"], b["parties"]["s"]
    assert ea["tokens_attacked"] == 40 and ea["links_per_record"]["tokens"] == len(
        np.unique(quiet.primary.links["s"].tokens)
    )
    assert ea["sigma"] == 0 and ea["theorem1_epsilon"] is None and eb["sigma"] > 0 and eb["theorem1_epsilon"] > 0
    assert ea["attacks"]["dictionary"]["exact"] == 1.0 and ea["attacks"]["aggregation"]["within_radius"] == 1.0
    assert eb["attacks"]["aggregation"]["median_error"] > ea["attacks"]["aggregation"]["median_error"]
    assert eb["strongest"]["rate"] < ea["strongest"]["rate"] == 1.0
    text = json.dumps(a)  # rates and counts only: no token, row or identifier
    assert 'tokens": [' not in text and str(round(float(base[0, 0]), 6)) not in text
    assert a["job_id"] == quiet.primary.job_id and "dictionary" in "\n".join(report_lines(a))


def test_the_exact_baselines_no_match_row_is_not_attacked():
    """link_exact links a record without an exact match to a virtual row n (the mean features):
    the report attacks the real records only (an IndexError before)."""
    from linkage.pipeline import link_exact

    primary, base = coordinates(5, m=200, n=50)
    primary[:100] = base[np.arange(100) % 50]  # half the records match exactly
    result = link_exact(primary, {"s": base}, secret=SECRET)
    entry = privacy_report(result, primary, {"s": base}, "euclidean")["parties"]["s"]
    assert entry["tokens_attacked"] == 50 and entry["attacks"]["dictionary"]["exact"] == 1.0


def test_a_failing_attack_is_reported_not_fatal(monkeypatch):
    import linkage.privacy as privacy

    primary, base = coordinates(6, m=100, n=30)
    result = link(primary, {"s": base}, k=3, tau=1.0, secret=SECRET)
    monkeypatch.setattr(privacy, "dictionary_attack", lambda *a, **k: 1 / 0)
    report = privacy.safe_report(result, primary, {"s": base}, "euclidean")
    assert report["error"] == "the attacks failed: ZeroDivisionError: division by zero" and report["parties"] == {}
    assert report_lines(report) == [
        "privacy: tau=1 K=3: not measured, the attacks failed: ZeroDivisionError: division by zero"
    ]


def test_a_secondary_sees_its_attack_rates_only():
    from linkage.privacy import secondary_view

    primary, base = coordinates(7, m=200, n=40)
    result = link(primary, {"a": base, "b": base[:30]}, k=3, tau=1.0, secret=SECRET)
    report = privacy_report(result, primary, {"a": base, "b": base[:30]}, "euclidean")
    view = secondary_view(report, "a")
    assert list(view["parties"]) == ["a"] and set(view["parties"]["a"]) == {"attacks", "strongest"}
    assert "sigma" not in json.dumps(view) and "links_per_record" not in json.dumps(view)
    assert secondary_view(report, "c")["parties"] == {"c": {"attacks": {}, "strongest": None}}  # e.g. a non-anchor


def test_a_report_of_another_job_is_refused_and_none_removes_a_stale_one(tmp_path):
    primary, base = coordinates(4, m=100, n=30)
    result = link(primary, {"s": base}, k=3, tau=1.0, secret=SECRET)
    save_privacy(privacy_report(result, primary, {"s": base}, "euclidean", max_tokens=10), tmp_path)
    assert load_privacy(tmp_path, result.primary.job_id)["k"] == 3
    with pytest.raises(LinkageError, match="privacy report of job .* not of this linkage's job 'other'"):
        load_privacy(tmp_path, "other")
    save_privacy(None, tmp_path)
    assert not (tmp_path / PRIVACY).exists() and load_privacy(tmp_path, result.primary.job_id) is None


def test_a_run_reports_its_privacy_in_the_summary_and_fedsim_report(tmp_path, capsys):
    from app.config import RunConfig
    from app.modes import run_experiment
    from fedsim.report import one_run

    cfg = RunConfig.of(dataset="hdb", n_rows=400, k=5, epochs=1, batch_size=64, out_dir=str(tmp_path / "runs"))
    summary = run_experiment(cfg.replace(privacy="off"), tmp_path / "run")  # the exact release of old
    entry = summary["privacy"]["parties"]["school"]
    assert summary["privacy"]["tau"] == 1.0 and entry["attacks"]["dictionary"]["exact"] > 0.9
    assert one_run(tmp_path / "run") == 0
    assert "privacy: tau=1 K=5" in capsys.readouterr().out
    off = run_experiment(cfg.replace(privacy_report=False), tmp_path / "off")
    assert off["privacy"] is None


def test_a_run_with_no_privacy_option_reports_the_defended_settings_it_used(tmp_path, capsys):
    """No option set: the schools' floor is the standard level, sized from their own spacing."""
    from app.config import RunConfig
    from app.modes import run_experiment
    from fedsim.report import one_run
    from linkage.protection import spacing

    cfg = RunConfig.of(dataset="hdb", n_rows=400, k=5, epochs=1, batch_size=64, out_dir=str(tmp_path / "runs"))
    summary = run_experiment(cfg, tmp_path / "run")
    protection, entry = summary["privacy"]["protection"], summary["privacy"]["parties"]["school"]
    got = protection["parties"]["school"]
    assert protection["level"] == "standard" and got["compose"] and not got["floor"]["exact"]
    assert got["spacing"] > 0 and got["noise"] == pytest.approx(got["spacing"])
    assert got["radius"] == pytest.approx(got["spacing"] / 2)
    assert entry["noise_per_distance"] >= got["noise"] * (1 - 1e-9) and entry["sigma"] > 0
    from app.data import load_data

    schools = load_data(cfg).secondaries["school"].identifiers
    assert got["spacing"] == pytest.approx(spacing(schools, "euclidean"))  # from the schools' own table
    assert one_run(tmp_path / "run") == 0
    assert "protection: level standard" in capsys.readouterr().out


def membership_rate(result, primary, base) -> float:
    party_link = result.primary.links["s"]
    guess = membership_attack(party_link, primary, base, "euclidean")  # (T,) register rows, tokens ascending
    tokens = np.unique(party_link.tokens)
    return float((guess == result.secondaries["s"].row_of_token[tokens]).mean())


def test_which_records_link_a_token_names_it_whatever_the_noise_on_the_similarities():
    """A primary holding the register links its own records to it and compares each token's set
    of linked records with each register row's: the similarities' noise does not enter. On the
    data where the dictionary attack falls to a third at tau 0.05 (above), the link sets still
    name nearly every record, and the report's strongest attack must say so."""
    primary, base = coordinates(2, m=600, n=150, scale=200.0)
    exact = link(primary, {"s": base}, k=8, tau=1.0, secret=SECRET)
    assert membership_rate(exact, primary, base) == 1.0  # no two of 150 uniform points share a link set
    noisy = link(primary, {"s": base}, k=8, tau=0.05, secret=SECRET)
    named = membership_rate(noisy, primary, base)
    assert named > 0.6 > hit_rate(noisy, primary, base, "euclidean"), named
    report = privacy_report(noisy, primary, {"s": base}, "euclidean")
    entry = report["parties"]["s"]
    assert entry["attacks"]["membership"]["exact"] == pytest.approx(named)  # every token attacked (150 < 300)
    assert entry["strongest"] == {"attack": "membership", "rate": pytest.approx(named)}


@pytest.mark.parametrize("metric", ["manhattan", "chebyshev"])
def test_locations_linked_by_another_geometry_are_reported_as_not_measured(metric):
    """The location attacks (greedy, trilateration, centroid) assume Euclidean distances: on 2-D
    identifiers linked by city-block or the largest difference they are not run, and the report
    says so in its entry and its lines instead of leaving them out silently."""
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 10, (60, 2))
    primary = base[rng.integers(0, 60, 200)] + rng.normal(0, 0.1, (200, 2))
    res = link(primary, {"s": base}, k=3, tau=1.0, secret=b"x" * 32, metric=metric)
    report = privacy_report(res, primary, {"s": base}, metric, max_tokens=40)
    entry = report["parties"]["s"]
    assert "aggregation" not in entry["attacks"] and "locations" in entry["not_measured"]  # trilateration
    assert any("not measured: location attacks" in line for line in report_lines(report))
    euclid = link(primary, {"s": base}, k=3, tau=1.0, secret=b"x" * 32)
    plain = privacy_report(euclid, primary, {"s": base}, "euclidean", max_tokens=40)["parties"]["s"]
    assert "aggregation" in plain["attacks"] and "not_measured" not in plain
