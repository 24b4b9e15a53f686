"""Entity Augmentation's guests met by a private set intersection of their ids
(app/entity_aug/id_exchange.py), each party holding only parties.toml and its own CSV.

Oracle: what the label holder and each guest build from the exchange equals what ea_data builds
from every party's file in one folder (entities, labels, split, held, each guest's block and batch
schedule), with the guests' rows in an order of their own. A hostile plan or answer is refused
by name before it is used."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flwr.app import Array

from app.config import RunConfig
from app.entity_aug import id_exchange as ex
from app.entity_aug.parties import batch_schedule, ea_data, ea_settings
from app.messages import ProtocolError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits"
SPEC = "parties.toml"


def _folders(tmp_path: Path, rows: int = 400) -> dict[str, Path]:
    """'all': every file; one home per party with parties.toml and its own file only. The
    guests' rows shuffled (their order is their own) and the run cut to ``rows`` images."""
    rng = np.random.default_rng(5)
    full = tmp_path / "all"
    full.mkdir()
    shutil.copy(EXAMPLE / SPEC, full / SPEC)
    labels = pd.read_csv(EXAMPLE / "labels.csv").head(rows)
    labels.to_csv(full / "labels.csv", index=False)
    for guest in ("left", "right"):
        df = pd.read_csv(EXAMPLE / f"{guest}.csv")
        df = df[df["image_id"].isin(labels["image_id"])]
        df.iloc[rng.permutation(len(df))].to_csv(full / f"{guest}.csv", index=False)
    homes = {"all": full}
    for party, file in (("primary", "labels.csv"), ("left", "left.csv"), ("right", "right.csv")):
        home = homes[party] = tmp_path / party
        home.mkdir()
        shutil.copy(full / SPEC, home / SPEC)
        shutil.copy(full / file, home / file)
    return homes


def _cfg(folder: Path) -> RunConfig:
    return RunConfig.of(dataset="csv", data_dir=str(folder), mode="entity-aug", ea_variant="augment", seed=3)


def _meet(homes: dict[str, Path]):
    """The exchange as the ServerApp and the guests' ClientApps run it, in one process."""
    primary = _cfg(homes["primary"])
    exchange = ex.Exchange.start(primary)
    answers, asked = {}, {}
    for guest in ("left", "right"):
        answers[guest], asked[guest] = ex.answer(_cfg(homes[guest]), guest, exchange.request)
    data = ex.matched_data(primary, *exchange.matches(answers))
    return primary, data, asked


def test_the_exchange_gives_every_party_what_one_folder_gives(tmp_path):
    homes = _folders(tmp_path)
    with pytest.raises(Exception, match="needs every party's file"):  # today's primary alone cannot
        ea_data(_cfg(homes["primary"]))
    primary, data, asked = _meet(homes)
    whole = ea_data(_cfg(homes["all"]))
    assert not all(h.all() for h in whole.held.values())  # planted: some images held by one guest only
    np.testing.assert_array_equal(data.labels, whole.labels)
    np.testing.assert_array_equal(data.entity_ids, whole.entity_ids)
    for part in ("train", "val", "test"):
        np.testing.assert_array_equal(getattr(data.split, part), getattr(whole.split, part))
    settings = ea_settings(primary)
    for guest in ("left", "right"):
        np.testing.assert_array_equal(data.held[guest], whole.held[guest])
        assert data.blocks[guest].shape == whole.blocks[guest].shape and not data.blocks[guest].any()
        inputs, plan = ex.plan_inputs(_cfg(homes[guest]), guest, ex.plan_content(primary, data, guest), asked[guest])
        np.testing.assert_array_equal(inputs.x, whole.blocks[guest])  # its features, by entity
        want = batch_schedule(_cfg(homes["all"]), whole, settings, guest)
        np.testing.assert_array_equal(inputs.schedule.records, want.records)
        assert (inputs.schedule.order_seed, inputs.schedule.steps_per_epoch) == (want.order_seed, want.steps_per_epoch)
        assert inputs.schedule.batch_size == want.batch_size and len(plan.entities) == whole.held[guest].sum()


def test_a_hostile_plan_or_answer_is_refused_by_name(tmp_path):
    homes = _folders(tmp_path, rows=120)
    primary, data, asked = _meet(homes)
    left = _cfg(homes["left"])
    content = ex.plan_content(primary, data, "left")
    held = int(data.held["left"].sum())
    content["ea_plan"]["rows"] = Array(np.full(held, 10**6, dtype=np.int64))  # rows it does not have
    with pytest.raises(ProtocolError, match="rows repeated or outside this party's"):
        ex.plan_inputs(left, "left", content, asked["left"])
    content = ex.plan_content(primary, data, "left")
    content["ea_hello"]["entities_total"] = asked["left"] + 1  # more entities than ids it was sent
    with pytest.raises(ProtocolError, match="entities, 120 ids sent"):
        ex.plan_inputs(left, "left", content, asked["left"])
    exchange = ex.Exchange.start(primary)
    answer, _ = ex.answer(left, "left", exchange.request)
    answer["ea_ids"]["width"] = 0
    with pytest.raises(ProtocolError, match="secondary 'left': declared 0 features"):
        exchange.matches({"left": answer})
    answer, _ = ex.answer(left, "left", exchange.request)
    answer["ea_ids_points"]["theirs"] = answer["ea_ids_points"]["own"]  # not the ids it was sent
    with pytest.raises(ProtocolError, match="secondary 'left': reblinded"):
        exchange.matches({"left": answer})
    answer, _ = ex.answer(left, "left", exchange.request)
    own = answer["ea_ids_points"]["own"].numpy()
    answer["ea_ids_points"]["own"] = Array(np.concatenate([own, own[:1]]))  # an id twice
    with pytest.raises(ProtocolError, match="secondary 'left': .*repeated id"):
        exchange.matches({"left": answer})


def test_fedsim_trains_check_on_a_label_holder_holding_only_its_own_file(tmp_path):
    homes = _folders(tmp_path, rows=120)
    assert ex.check(_cfg(homes["primary"])) == ["left", "right"]  # the guests' files are on their hosts
    assert ex.check(_cfg(homes["all"])) == ["left", "right"]  # every file here: the whole check
    spec = homes["primary"] / SPEC
    spec.write_text(spec.read_text().replace('task = "multiclass"', 'task = "regression"'))
    with pytest.raises(Exception, match="regression"):
        ex.check(_cfg(homes["primary"]))
    subset = RunConfig.of(dataset="csv", data_dir=str(homes["all"]), mode="entity-aug", parties="left")
    with pytest.raises(ValueError, match="every secondary of parties.toml takes part"):
        ex.check(subset)


def test_a_plan_that_would_make_a_guest_allocate_without_bound_is_refused(tmp_path):
    """The plan's schedule is the guest's to check too: its batch size and order seed follow from
    its own run config, and an epoch's steps cannot outnumber the run's entities (a stream of
    steps x batch ids is drawn each epoch: 2**30 steps would exhaust the guest's memory)."""
    homes = _folders(tmp_path, rows=120)
    primary, data, asked = _meet(homes)
    left = _cfg(homes["left"])
    for field, value, why in (
        ("steps_per_epoch", 2**30, "steps per epoch"),
        ("batch_size", 7, "batch size"),
        ("order_seed", 12345, "order seed"),
    ):
        content = ex.plan_content(primary, data, "left")
        content["ea_hello"][field] = value
        with pytest.raises(ProtocolError, match=f"not this party's.*{why}"):
            ex.plan_inputs(left, "left", content, asked["left"])


def test_a_guest_reads_parties_toml_once_per_message_to_know_its_name(tmp_path, monkeypatch):
    """A simulated guest's ClientApp finds its name on every message; it read parties.toml twice
    (whether ids are exchanged, then the names). Now once, with the same answer."""
    from flwr.app import Context, RecordDict

    import datasets.csv_parties as csv_parties
    from app.entity_aug.client import secondary_name

    homes, reads = _folders(tmp_path, rows=40), []
    real = csv_parties.read_spec
    monkeypatch.setattr(csv_parties, "read_spec", lambda folder: reads.append(folder) or real(folder))
    context = Context(run_id=1, node_id=2, node_config={"partition-id": 1}, state=RecordDict(), run_config={})
    assert secondary_name(_cfg(homes["left"]), context) == "right" and len(reads) == 1
    assert ex.exchanged_secondaries(RunConfig.of(dataset="hdb", mode="entity-aug")) is None and len(reads) == 1


def test_a_plan_or_answer_whose_values_are_not_integers_is_refused_by_name(tmp_path):
    """A width or plan field of 'abc', NaN or inf raised a bare ValueError or OverflowError naming
    no one; a 2-D or empty records array was accepted (2-D batches; an empty one failed later,
    inside training); a hello without its record raised a KeyError."""
    homes = _folders(tmp_path, rows=120)
    primary, data, asked = _meet(homes)
    left = _cfg(homes["left"])
    exchange = ex.Exchange.start(primary)
    for width in ("abc", float("nan"), float("inf"), 2.5):
        answer, _ = ex.answer(left, "left", exchange.request)
        answer["ea_ids"]["width"] = width
        with pytest.raises(ProtocolError, match="secondary 'left': .*width"):
            exchange.matches({"left": answer})
    for field, value in (("entities_total", "x"), ("steps_per_epoch", float("nan")), ("order_seed", float("inf"))):
        content = ex.plan_content(primary, data, "left")
        content["ea_hello"][field] = value
        with pytest.raises(ProtocolError, match=f"not this party's.*{field}"):
            ex.plan_inputs(left, "left", content, asked["left"])
    for records, why in ((lambda r: r[:4].reshape(2, 2), "records"), (lambda r: r[:0], "records")):
        content = ex.plan_content(primary, data, "left")
        content["ea_plan"]["records"] = Array(records(content["ea_plan"]["records"].numpy()))
        with pytest.raises(ProtocolError, match=f"not this party's.*{why}"):
            ex.plan_inputs(left, "left", content, asked["left"])
    content = ex.plan_content(primary, data, "left")
    del content["ea_hello"]
    with pytest.raises(ProtocolError, match="query.ea_hello"):
        ex.plan_inputs(left, "left", content, asked["left"])
