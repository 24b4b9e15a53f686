"""A peer's integer fields are read strictly: an int (or a float with no fraction, as Flower's
records may carry one), never a bool, a string or a fraction rounded down, and a count is never
negative. A refusal names the message and the field."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from app import messages
from strategies.entity_aug.channel import StepRequest as EAStepRequest
from strategies.vfl.wire import StepReply, StepRequest
from strategies.wire_checks import ProtocolError, peer_integer


def keep(**fields) -> RecordDict:
    return RecordDict({"keep": ConfigRecord({"run": "r1", **fields})})


@pytest.mark.parametrize("value", [2.9, True, "3", "abc", -1, float("nan"), float("inf"), b"3"])
def test_a_keep_with_a_count_that_is_not_a_non_negative_integer_is_refused_naming_it(value):
    with pytest.raises(ProtocolError, match=r"query\.keep.*'epoch'"):
        messages.read_named(
            keep(epoch=value, applied=4), "keep", "query.keep", names=("run",), ints=("epoch", "applied")
        )


@pytest.mark.parametrize("value, read", [(3, 3), (3.0, 3), (0, 0)])
def test_a_keep_with_integer_counts_is_read_as_ints(value, read):
    got = messages.read_named(
        keep(epoch=value, applied=4), "keep", "query.keep", names=("run",), ints=("epoch", "applied")
    )
    assert got == {"run": "r1", "epoch": read, "applied": 4} and type(got["epoch"]) is int


def test_peer_integer_states_what_it_accepts():
    assert peer_integer(7.0) == 7 and peer_integer(-2) == -2
    for value in (True, False, 7.5, "7", None, float("nan"), b"7"):
        assert peer_integer(value) is None


def vfl_step_fields(**over) -> tuple[dict, dict]:
    arrays, fields = StepRequest([], np.arange(3), "job", 5, "d", save=("r1", 2)).encode()
    return arrays, {**fields, **over}


@pytest.mark.parametrize("field", ["n_apply", "cursor", "save_epoch"])
@pytest.mark.parametrize("value", [0.5, True, "1", -1])
def test_a_step_request_with_a_count_that_is_not_an_integer_is_refused_naming_it(field, value):
    with pytest.raises(ProtocolError, match=f"train.step.*'{field}'"):
        StepRequest.decode(*vfl_step_fields(**{field: value}))


@pytest.mark.parametrize("field", ["applied", "state_applied", "state_epoch"])
@pytest.mark.parametrize("value", [3.5, True, "3", -2])
def test_a_step_reply_with_a_count_that_is_not_an_integer_is_refused_naming_the_party(field, value):
    fields = {"applied": 3, "state_applied": 3, "state_epoch": 1, "state_digest": "d", field: value}
    with pytest.raises(ProtocolError, match=f"party 'school'.*'{field}'"):
        StepReply.decode({"emb": np.zeros((3, 2), np.float32)}, fields, "school", "train.step")


@pytest.mark.parametrize("field, value", [("epoch", 1.5), ("epoch", -1), ("step", True), ("step", -2), ("step", "4")])
def test_an_entity_augmentation_step_with_a_bad_epoch_or_step_is_refused_naming_it(field, value):
    arrays, fields = EAStepRequest(1, 4, None).encode()
    with pytest.raises(ProtocolError, match=f"train.ea_step.*'{field}'"):
        EAStepRequest.decode(arrays, {**fields, field: value})


def test_the_step_codecs_still_read_what_an_honest_party_sends():
    got = StepRequest.decode(*vfl_step_fields(cursor=5.0))
    assert (got.cursor, got.save, len(got.apply)) == (5, ("r1", 2), 0) and type(got.cursor) is int
    reply = StepReply.decode({"emb": np.zeros((3, 2), np.float32)}, {"applied": 3}, "school", "train.step")
    assert reply.applied == 3 and reply.state is None
    assert EAStepRequest.decode(*EAStepRequest(0, -1, None).encode()) == EAStepRequest(0, -1, None)


@pytest.mark.parametrize("missing", ["keep_attempt", "keep_run", "save_run"])
def test_a_step_with_part_of_a_keep_or_save_is_refused_naming_what_it_lacks(missing):
    arrays, fields = StepRequest([], np.arange(3), "job", 5, "d", save=("r1", 2), keep=("r1", 1, "a1", "")).encode()
    del fields[missing]
    with pytest.raises(ProtocolError, match=f"train.step.*{missing}"):
        StepRequest.decode(arrays, fields)


def test_a_restore_reply_or_an_exposure_with_a_count_that_is_not_an_integer_is_refused_naming_the_party():
    from app.vfl.channel import FlowerChannel

    channel = FlowerChannel(None, {"school": 1}, 5.0)
    reply = RecordDict({"state": ConfigRecord({"digest": "d", "applied": 2.9})})
    channel._exchange = lambda *a: {"school": reply}  # the party's answer, as the grid would bring it
    with pytest.raises(ProtocolError, match="party 'school'.*'applied'"):
        channel.restore("/runs/r1/checkpoint", 0)
    exposure = {"mse": 1.0, "mean_baseline_mse": 2.0, "ratio": 0.5, "auxiliary_records": 10.5}
    with pytest.raises(ProtocolError, match="party 'school'.*'auxiliary_records'"):
        messages.read_exposure(RecordDict({"exposure": ConfigRecord(exposure)}), "school")


@pytest.mark.parametrize(
    "field, value", [("lr_scale", "0.5"), ("lr_scale", True), ("job_id", 12345), ("digest", 7), ("job_id", None)]
)
def test_a_step_with_a_number_or_a_name_of_the_wrong_kind_is_refused_naming_it(field, value):
    arrays, fields = StepRequest([], np.arange(3), "job", 5, "d", lr_scale=0.5).encode()
    fields = {k: v for k, v in {**fields, field: value}.items() if v is not None}  # None: the field left out
    with pytest.raises(ProtocolError, match=f"train.step.*'{field}'"):
        StepRequest.decode(arrays, fields)


@pytest.mark.parametrize("value", ["0.5", True, [1.0]])
def test_an_exposure_with_a_value_of_the_wrong_kind_is_refused_naming_the_party(value):
    exposure = {"mse": value, "mean_baseline_mse": 2.0, "ratio": 0.5, "auxiliary_records": 10}
    with pytest.raises(ProtocolError, match="party 'school'.*'mse'"):
        messages.read_exposure(RecordDict({"exposure": ConfigRecord(exposure)}), "school")


@pytest.mark.parametrize("state", [None, {"applied": 2}, {"digest": 5, "applied": 2}])
def test_a_restore_reply_without_its_state_or_digest_is_refused_naming_the_party(state):
    from app.vfl.channel import FlowerChannel

    channel = FlowerChannel(None, {"school": 1}, 5.0)
    reply = RecordDict({} if state is None else {"state": ConfigRecord(state)})
    channel._exchange = lambda *a: {"school": reply}  # the party's answer, as the grid would bring it
    with pytest.raises(ProtocolError, match="party 'school'.*query.restore"):
        channel.restore("/runs/r1/checkpoint", 0)


@pytest.mark.parametrize("field", ["n_apply", "cursor"])
def test_a_step_request_without_a_count_is_refused_naming_it(field):
    arrays, fields = vfl_step_fields()
    del fields[field]
    with pytest.raises(ProtocolError, match=f"train.step.*'{field}'.*missing"):
        StepRequest.decode(arrays, fields)


@pytest.mark.parametrize("field", ["epoch", "step"])
def test_an_entity_augmentation_step_without_its_epoch_or_step_is_refused_naming_it(field):
    arrays, fields = EAStepRequest(1, 4, None).encode()
    del fields[field]
    with pytest.raises(ProtocolError, match=f"train.ea_step.*'{field}'.*missing"):
        EAStepRequest.decode(arrays, fields)
