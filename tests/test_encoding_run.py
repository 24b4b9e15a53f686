"""Run config encoding="bloom": the parties link on Bloom / FEDERAL filters by Hamming distance,
and the filters find the neighbours the raw identifiers find (planted truth: exact copies)."""

import numpy as np
import pytest

from app.config import ConfigError, RunConfig
from app.data import load_data
from app.vfl.inprocess import run_in_process
from app.vfl.linking import run_linkage
from linkage.store import load_primary


def top_rows(result, party: str) -> np.ndarray:
    return result.secondaries[party].row_of_token[result.primary.tokens[party]]  # (m, K) secondary rows


@pytest.mark.parametrize("dataset", ["synthetic", "game"])
def test_bloom_links_find_what_raw_links_find(dataset, tmp_path):
    # the encodings' fidelity, compared on exact releases (under noise each draws its own)
    cfg = RunConfig.of(dataset=dataset, n_rows=600, k=5, sigma_cf=0.0, privacy="off", out_dir=str(tmp_path))
    ds, settings = load_data(cfg), cfg.resolve()
    raw = run_linkage(ds, cfg, settings)
    bloom = run_linkage(ds, cfg.replace(encoding="bloom"), settings)
    assert raw.primary.metric in ("euclidean", "edit") and bloom.primary.metric == "hamming"
    party = next(iter(ds.secondaries))
    r, b = top_rows(raw, party), top_rows(bloom, party)
    if dataset == "synthetic":  # exact copies (sigma-cf 0): both put the true row first
        truth = ds.true_match[party]
        assert (r[:, 0] == truth).mean() == 1.0 and (b[:, 0] == truth).mean() > 0.95
        # FEDERAL filters keep the Euclidean neighbourhood: the K neighbours mostly agree
        assert np.mean([len(set(x) & set(y)) / len(x) for x, y in zip(r, b)]) > 0.6
    else:  # titles: every title with an identical twin gets an identical filter, at Hamming distance 0
        titles, other = ds.primary.identifiers, ds.secondaries[party].identifiers
        exact = other[r[:, 0]] == titles
        assert exact.mean() > 0.3 and (other[b[exact, 0]] == titles[exact]).all()


def test_a_bloom_run_trains(tmp_path):
    cfg = RunConfig.of(dataset="house", n_rows=800, k=5, encoding="bloom", epochs=1, max_steps=4, out_dir=str(tmp_path))
    run = run_in_process(cfg)
    assert len(run.losses) == 4 and np.isfinite(run.losses).all()
    (job,) = (tmp_path / "linkage").iterdir()  # the job the run trained on was linked on the filters
    assert load_primary(job).metric == "hamming"


def test_unknown_encoding_is_refused():
    with pytest.raises(ConfigError, match="encoding"):
        RunConfig.of(encoding="md5").validate()
    with pytest.raises(ConfigError, match="combine"):
        RunConfig.of(dataset="synthetic", method="combine", encoding="bloom").validate()
    with pytest.raises(ConfigError, match="linkage-dir"):
        RunConfig.of(encoding="bloom", linkage_dir="/tmp/some-job").validate()
