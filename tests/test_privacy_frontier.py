"""bench.privacy_frontier joins measured rows only: a level's cost is paired by seed against off,
a level re-measured in a later file replaces the old rows whole, and the release's attacks sit
beside it."""

from __future__ import annotations

from bench.privacy_frontier import frontier


def _run(defence: str, seed: int, test: float, inversion: float = 0.5) -> dict:
    attacks = {"s": {"direction": 0.5}}
    return {"dataset": "d", "defence": defence, "seed": seed, "test": test, "metric": "accuracy",
            "exchange": {"attacks": attacks}, "inversion": {"s": inversion}}  # fmt: skip


def test_the_cost_is_paired_by_seed_and_a_remeasured_level_replaces_the_old_rows_whole():
    old = [_run("none", 0, 0.90), _run("none", 1, 0.80), _run("standard", 0, 0.10), _run("standard", 3, 0.2)]
    new = [_run("grad", 0, 0.0), _run("standard", 0, 0.85, 0.7), _run("standard", 1, 0.79), _run("standard", 2, 0.5)]
    release = [{"data": "d", "level": "standard", "secondary": "s", "attacks_pct": {"membership": 91.0,
                "dictionary": 40.0, "greedy": 1.0, "centroid": 7.5}, "averaging_radii": 2.5}]  # fmt: skip
    table = frontier([old, new], release).splitlines()  # off from the old file; standard from the new one only
    standard = next(line for line in table if "| standard |" in line)
    # seeds 0 and 1 paired: -0.05 and -0.01 -> -0.0300 ± 0.0283 over 2; the old seeds 0 and 3 gone
    assert "-0.0300 ± 0.0283 (2)" in standard and "0.7133 ± 0.1872 (3)" in standard
    assert "| 0.567 |" in standard  # the inversion's mean over the three runs (0.7, 0.5, 0.5)
    assert "91.0 %" in standard and "| 7.5 % |" in standard and "| 2.50 |" in standard
    assert not any("grad" in line for line in table)
