"""Entity Augmentation mode: interpolated labels, the per-secondary queue's timeout fallback, the
refusal of regression, the overlap split, and whole runs (in process and through Flower)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from app.config import ConfigError, RunConfig
from app.entity_aug.parties import (
    build_party,
    build_primary,
    ea_data,
    read_request,
    request_content,
)
from app.modes import run_experiment
from datasets.overlap import overlap_split
from strategies.entity_aug.channel import LocalChannel, StepReply, StepRequest
from strategies.entity_aug.exchange import Exchanger, SecondaryTimeout
from strategies.entity_aug.model import (
    EntityAugError,
    interpolated_labels,
    party_records,
    soft_cross_entropy,
)

TINY = dict(dataset="digits", n_rows=300, mode="entity-aug")


def ea_cfg(**kw) -> RunConfig:
    return RunConfig.of(**{**TINY, **kw})


# ---------------------------------------------------------------------------- labels


def test_interpolated_label_equals_hand_computed_example():
    labels = np.array([0, 2, 1, 1])  # entity -> class
    ids = np.array(
        [
            [0, 1],  # party a (width 2) sent entities 0, 1
            [2, 1],  # party b (width 2) sent entities 2, 1
            [3, 1],
        ]
    )  # party c (width 4) sent entities 3, 1
    soft = interpolated_labels(ids, [2, 2, 4], labels, n_classes=3)
    # row 0: a's entity 0 is class 0 (weight 2/8), b's entity 2 is class 1 (2/8), c's entity 3 is class 1 (4/8)
    # row 1: every party sent entity 1 (class 2): the hard label
    np.testing.assert_allclose(soft, [[0.25, 0.75, 0.0], [0.0, 0.0, 1.0]])


def test_primary_trains_on_the_interpolated_label_with_widths_from_the_activations():
    cfg = ea_cfg()
    data = ea_data(cfg)
    primary = build_primary(cfg, data)
    rng = np.random.default_rng(0)
    both = np.flatnonzero(primary.trains_on["left"] & primary.trains_on["right"])  # training entities of both
    ids = {"left": both[[0, 5]], "right": both[[7, 5]]}
    acts = {p: rng.normal(size=(2, 70)).astype(np.float32) for p in ids}  # equal widths: weights 1/2, 1/2
    y = data.labels
    expected_soft = np.zeros((2, 10))
    for p in ids:
        expected_soft[np.arange(2), y[ids[p]]] += 0.5
    with torch.no_grad():
        logits = primary.model(torch.cat([torch.as_tensor(acts[p]) for p in primary.parties], 1))
        want = float(
            -(torch.as_tensor(expected_soft, dtype=torch.float32) * torch.log_softmax(logits, 1)).sum(1).mean()
        )
    loss, grads = primary.train_step(acts, ids)
    assert loss == pytest.approx(want, rel=1e-5)
    assert {p: g.shape for p, g in grads.items()} == {"left": (2, 70), "right": (2, 70)}


def test_binary_soft_loss_is_bce_on_the_interpolated_probability():
    logits = torch.tensor([[0.3], [-1.2]])
    soft = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    p = torch.sigmoid(logits[:, 0])
    want = -(soft[:, 1] * torch.log(p) + soft[:, 0] * torch.log(1 - p)).mean()
    assert float(soft_cross_entropy(logits, soft)) == pytest.approx(float(want), rel=1e-6)


# ---------------------------------------------------------------------------- queue and timeout


class FakeParty:
    """Answers step s with entity id 100*k + s and activation [[s]]; ``slow_steps``: sleeps first."""

    def __init__(self, k: int, slow_steps: tuple[int, ...] = (), sleep: float = 0.0) -> None:
        self.k, self.slow_steps, self.sleep = k, slow_steps, sleep
        self.requests: list[StepRequest] = []

    def step(self, req: StepRequest) -> StepReply:
        self.requests.append(req)
        if req.step in self.slow_steps:
            time.sleep(self.sleep)
        return StepReply(np.array([100 * self.k + req.step]), np.array([[float(req.step)]], dtype=np.float32))

    def embed(self, ids: np.ndarray) -> np.ndarray:
        return np.zeros((len(ids), 1), dtype=np.float32)


def test_a_secondary_that_misses_the_timeout_is_replaced_by_its_last_activation():
    fast, slow = FakeParty(0), FakeParty(1, slow_steps=(1,), sleep=0.6)
    channel = LocalChannel({"fast": fast, "slow": slow}, threaded=True)
    ex = Exchanger(channel, timeout=0.1, patience=10.0)
    try:
        replies, fresh = ex.step(0, 0, {})
        assert fresh == {"fast", "slow"} and ex.queue.stale == {"fast": 0, "slow": 0}
        grads = {p: np.ones((1, 1), dtype=np.float32) for p in fresh}

        t0 = time.monotonic()
        replies, fresh = ex.step(0, 1, grads)
        assert time.monotonic() - t0 < 0.5  # did not wait for the slow secondary
        assert fresh == {"fast"}
        assert replies["slow"].ids.tolist() == [100] and replies["slow"].act.tolist() == [[0.0]]  # its step-0 answer
        assert replies["fast"].ids.tolist() == [1]
        assert ex.queue.stale == {"fast": 0, "slow": 1}

        time.sleep(0.7)  # the slow secondary's late answer arrives: the freshest activation it has
        replies, fresh = ex.step(0, 2, {"fast": np.ones((1, 1), dtype=np.float32)})
        assert fresh == {"fast", "slow"} and replies["slow"].ids.tolist() == [101]
        assert [r.step for r in slow.requests] == [0, 1]  # busy secondaries get no second request
        assert ex.queue.stale == {"fast": 0, "slow": 1}

        ex.step(0, 3, {"slow": np.ones((1, 1), dtype=np.float32)})
        assert [r.step for r in slow.requests] == [0, 1, 3]
        assert slow.requests[2].grad is not None  # the gradient of its late (fresh) activation
        assert fast.requests[3].grad is None  # none was handed in for fast
    finally:
        channel.close()


def test_without_a_last_activation_a_silent_secondary_is_an_error():
    channel = LocalChannel({"ok": FakeParty(0), "dead": FakeParty(1, slow_steps=(0,), sleep=1.0)}, threaded=True)
    try:
        with pytest.raises(SecondaryTimeout, match="party 'dead' did not answer its first step"):
            Exchanger(channel, timeout=0.05, patience=0.2).step(0, 0, {})
    finally:
        channel.close()


def test_with_timeout_zero_a_late_secondary_fails_the_run_instead_of_falling_back():
    channel = LocalChannel({"ok": FakeParty(0), "late": FakeParty(1, slow_steps=(1,), sleep=1.0)}, threaded=True)
    ex = Exchanger(channel, timeout=0.0, patience=0.2)
    try:
        ex.step(0, 0, {})
        with pytest.raises(SecondaryTimeout, match=r"party 'late' did not answer step 1 \(no timeout fallback\)"):
            ex.step(0, 1, {})
    finally:
        channel.close()


def test_run_reports_how_often_a_slow_secondary_was_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSIM_PROBE_SECONDARY_DELAY", "2.0")
    cfg = ea_cfg(epochs=2, max_steps=6, secondary_timeout=0.5, ea_variant="augment")
    summary = run_experiment(cfg, tmp_path / "run")
    # margins for a busy CI machine: a normal step takes milliseconds, well inside 0.5 s
    # the first secondary ("left") sleeps 2 s on odd steps: it misses those (and the next while
    # busy); "right" never does. Steps 0 (nothing to fall back on) and 4 (after the epoch's flush) are fresh.
    assert summary["steps"] == 6 and summary["stale"]["right"] == 0
    assert 2 <= summary["stale"]["left"] <= 4
    assert summary["stale_fraction"]["left"] == summary["stale"]["left"] / 6
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stale"] == summary["stale"]


# ---------------------------------------------------------------------------- refusals and config


def test_regression_is_refused_with_a_clear_message(tmp_path):
    with pytest.raises(
        EntityAugError, match="entity augmentation is for classification.*'hdb' has a regression target"
    ):
        run_experiment(RunConfig.of(dataset="hdb", n_rows=300, mode="entity-aug"), tmp_path / "run")


@pytest.mark.parametrize(
    "values,match",
    [
        ({"mode": "ea"}, "run-config 'mode' must be one of"),
        ({"overlap": 0.0}, r"run-config 'overlap' must be in \(0, 1\]"),
        ({"ea-variant": "mixed"}, "run-config 'ea-variant' must be one of"),
        ({"secondary-timeout": -1.0}, "run-config 'secondary-timeout' must be >= 0"),
        ({"guest-timeout": 1.0}, "run-config 'guest-timeout' was renamed 'secondary-timeout'"),
        ({"guest-delay": 1.0}, "run-config 'guest-delay' is no longer a run-config key: it is the test probe"),
    ],
)
def test_bad_entity_aug_keys_are_named(values, match):
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_flower(values)


# ---------------------------------------------------------------------------- overlap split and orders


def test_overlap_split_aligned_fraction_disjoint_shares_union_is_train():
    train = np.random.default_rng(1).choice(5000, 1000, replace=False)
    aligned, shares = overlap_split(train, 4, 0.05, np.random.default_rng(7))
    assert len(aligned) == 50 and len(shares) == 4
    sizes = [len(s) for s in shares]
    assert sum(sizes) == 950 and max(sizes) - min(sizes) <= 1
    parts = [aligned, *shares]
    for i in range(len(parts)):
        for j in range(i + 1, len(parts)):
            assert len(np.intersect1d(parts[i], parts[j])) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.sort(train))
    again, _ = overlap_split(train, 4, 0.05, np.random.default_rng(7))
    np.testing.assert_array_equal(again, aligned)
    full, empty = overlap_split(train, 4, 1.0, np.random.default_rng(7))
    assert len(full) == 1000 and all(len(s) == 0 for s in empty)


def test_variants_records_and_orders():
    train, aligned = np.arange(20), np.array([3, 7])
    shares = [np.array([0, 1, 2]), np.array([4, 5])]
    recs = party_records("augment", ["a", "b"], train, aligned, shares)
    assert recs["a"].tolist() == [0, 1, 2, 3, 7] and recs["b"].tolist() == [3, 4, 5, 7]
    assert party_records("aligned", ["a", "b"], train, aligned, shares)["b"].tolist() == [3, 7]
    assert len(party_records("full", ["a", "b"], train, aligned, shares)["a"]) == 20

    for variant, same in (("aligned", True), ("full", True), ("augment", False)):
        cfg = ea_cfg(ea_variant=variant, overlap=0.1)
        data = ea_data(cfg)
        parties = {p: build_party(cfg, p, data) for p in data.parties}
        sent = {p: party.step(StepRequest(0, 0, None)).ids for p, party in parties.items()}
        assert np.array_equal(sent["left"], sent["right"]) == same, variant
        for p, party in parties.items():
            assert np.isin(sent[p], party.schedule.records).all()
            assert np.isin(sent[p], data.split.train).all()  # never a validation / test entity


# ---------------------------------------------------------------------------- whole runs


def test_in_process_run_trains_and_writes_its_summary(tmp_path):
    cfg = ea_cfg(epochs=8, ea_variant="augment", overlap=0.1)
    summary = run_experiment(cfg, tmp_path / "run")
    run = tmp_path / "run"
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["test"]["accuracy"] == summary["test"]["accuracy"] > 0.3  # 10 classes: chance is 0.1
    assert set(on_disk) >= {"val", "test", "best_epoch", "seconds", "stale", "entities"}
    assert on_disk["stale"] == {"left": 0, "right": 0}
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 8 and lines[-1]["train_loss"] < lines[0]["train_loss"]
    assert (run / "primary_model.pt").exists()


def test_sweep_runner_runs_the_mode(tmp_path):
    from experiments.sweep import run_one

    values = {
        "dataset": "parkinsons",
        "mode": "entity-aug",
        "ea-variant": "aligned",
        "overlap": 0.1,
        "epochs": 2,
        "seed": 0,
    }
    summary = run_one(values, tmp_path / "s0", "inprocess")
    assert summary["ea_variant"] == "aligned" and summary["entities"]["aligned"] == 14
    assert set(summary["entities"]["records_per_party"].values()) == {14}


def test_secondary_state_survives_messages_like_an_uninterrupted_secondary():
    """The ClientApp's secondary (rebuilt from context.state for every message: model, Adam state,
    ids of its last activation) takes exactly the steps of one secondary object kept alive."""
    from app.entity_aug import client as ea_secondary

    cfg = ea_cfg(ea_variant="augment")
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    ea_secondary.persist(build_party(cfg, "right"), context)
    alive = build_party(cfg, "right")
    rng = np.random.default_rng(0)
    grad = None
    for step in [*range(5), -1]:
        req = read_request(request_content(StepRequest(0, step, grad)))  # through the wire format
        secondary = ea_secondary.restore(cfg, context)
        got = secondary.step(req)
        ea_secondary.persist(secondary, context)
        want = alive.step(req)
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.act, want.act)
        grad = rng.normal(size=want.act.shape).astype(np.float32) if step >= 0 else None
    final = ea_secondary.restore(cfg, context)
    for key, value in alive.model.state_dict().items():
        torch.testing.assert_close(final.model.state_dict()[key], value, rtol=0, atol=0)
    assert final.pending is None and str(context.state.config_records["ea_party"]["party"]) == "right"
    untrained = build_party(cfg, "right").model.state_dict()
    assert any(not torch.equal(untrained[k], v) for k, v in alive.model.state_dict().items())


def test_a_secondary_reads_its_data_once_per_run_not_per_message(monkeypatch):
    """Deployed, every message is a fresh ClientApp process: the secondary's feature block and batch
    schedule travel in context.state from its hello, so a step loads no dataset (it did before)."""
    from app.entity_aug import client as ea_secondary
    from app.entity_aug import parties

    cfg = ea_cfg(ea_variant="augment")
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    ea_secondary.persist(build_party(cfg, "right"), context)
    want = build_party(cfg, "right").step(StepRequest(0, 0, None))

    def no_loading(*_):
        raise AssertionError("the secondary loaded its dataset for a message")

    monkeypatch.setattr(parties, "ea_data", no_loading)
    monkeypatch.setattr(parties, "load_data", no_loading)
    got = ea_secondary.restore(cfg, context).step(StepRequest(0, 0, None))
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.act, want.act)


@pytest.mark.slow
def test_flower_secondary_timeout_falls_back_to_the_last_activation(tmp_path, monkeypatch):
    """Through Flower: the first secondary sleeps 2.5 s on odd steps, the primary waits 1 s for it,
    trains on its last activation instead, and reports how often. The delay is a probe in the
    environment, which the simulation passes on to its ClientApps."""
    from deploy.localsim import simulate

    monkeypatch.setenv("FEDSIM_PROBE_SECONDARY_DELAY", "2.5")
    values = {
        **{k.replace("_", "-"): v for k, v in TINY.items()},
        "epochs": 1,
        "max-steps": 4,
        "secondary-timeout": 1.0,
        "out-dir": str(tmp_path / "out"),
        "run-name": "ea-slow",
    }
    proc = simulate(values, tmp_path / "flwr-home", num_supernodes=2, timeout=300)
    run = tmp_path / "out" / "ea-slow"
    assert (run / "summary.json").exists(), proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["stale"]["left"] >= 1
    assert "stale" in proc.stdout  # the primary logs the counts


def test_a_runs_default_name_shows_the_aligned_share_only_where_the_run_uses_it():
    """A `flwr run` without run-name on own CSVs named its folder with the built-ins' overlap
    ("csv-ea-augment-x0.05-..."), though parties with entity ids set the aligned share themselves."""
    from app.entity_aug.server import default_run_name

    own = RunConfig.from_flower({"dataset": "csv", "mode": "entity-aug", "data-dir": "examples/digits"})
    assert default_run_name(own).startswith(f"csv-ea-{own.ea.variant}-s0-"), default_run_name(own)
    built = RunConfig.from_flower({"dataset": "credit", "mode": "entity-aug", "overlap": 0.2})
    assert default_run_name(built).startswith(f"credit-ea-{built.ea.variant}-x0.2-s0-"), default_run_name(built)
