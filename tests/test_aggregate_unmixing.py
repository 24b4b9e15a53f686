"""The unmixing attack on pooled neighbours (bench/aggregate_unmixing.py): a primary that knows
who is pooled recovers every pooled row exactly when the pool carries no noise, and learns
nothing better than the mean when the noise drowns the pool."""

import numpy as np

from bench.aggregate_unmixing import mixing, neighbours, score, unmix, weights


def planted(seed: int = 0):
    rng = np.random.default_rng(seed)
    prim, sec = rng.uniform(size=(150, 2)), rng.uniform(size=(30, 2))  # 150 records pool 30 rows
    g = rng.standard_normal((30, 3))
    idx, sims = neighbours(prim, sec, 5)
    return idx, sims, g


def test_noiseless_pools_give_every_row_back():
    idx, sims, g = planted()
    pooled = mixing(idx, weights(sims, 1.0, 0.0), len(g)) @ g  # (150, 3), weights on the attacker's grid
    ratio, named = score(unmix(idx, sims, pooled, len(g)), g, np.unique(idx))
    assert ratio < 1e-6 and named == 1.0


def test_drowned_pools_give_about_the_mean():
    idx, sims, g = planted(1)
    rng = np.random.default_rng(2)
    pooled = mixing(idx, weights(sims, 0.0, 0.0), len(g)) @ g + 100.0 * rng.standard_normal((150, 3))
    ratio, named = score(unmix(idx, sims, pooled, len(g)), g, np.unique(idx))
    # noise 100x the rows' spread leaves ~1 % of signal: no fit can beat the mean predictor (ratio 1)
    # by more than that, so 0.9 is a wide margin; a leak through the noise would score far lower
    assert ratio > 0.9 and named < 0.5
