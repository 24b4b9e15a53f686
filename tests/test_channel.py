"""The primary's handshake names parties by their own node config, never by node-id order."""

import time
from types import SimpleNamespace

import pytest

from app.transport import PartyError, handshake

pytestmark = pytest.mark.usefixtures("run_identity")  # tests/conftest.py: a Message needs a run


class FakeGrid:
    """Nodes answering query.hello with the party name of their node config."""

    def __init__(self, parties_by_node: dict[int, str]) -> None:
        self.parties_by_node = parties_by_node

    def get_node_ids(self):
        return list(self.parties_by_node)

    def push_messages(self, msgs):
        assert len(msgs) == len(self.parties_by_node)  # one hello per connected node, in node order
        return [f"m{m.metadata.dst_node_id}" for m in msgs]

    def pull_messages(self, ids):
        return [
            SimpleNamespace(
                has_error=lambda: False,  # party None: an answer without one
                content=SimpleNamespace(config_records={"hello": {} if p is None else {"party": p}}),
                metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=f"m{node}"),
            )
            for node, p in reversed(self.parties_by_node.items())
            if f"m{node}" in ids and p != ""
        ]  # "": silent


def test_parties_map_to_their_nodes_whatever_the_node_order():
    grid = FakeGrid({907: "c", 12: "a", 500: "b"})
    assert handshake(grid, ["a", "b", "c"], "/job", timeout=1) == {"a": 12, "b": 500, "c": 907}


@pytest.mark.parametrize(
    "nodes,match",
    [
        ({1: "a", 2: "a", 3: "b"}, "party 'a' is played by two nodes"),
        ({1: "a", 2: "b"}, r"missing \['c'\]"),
        ({1: "a", 2: "b", 3: "c", 4: "d"}, r"unexpected \['d'\]"),
    ],
)
def test_a_twice_configured_missing_or_unknown_party_is_refused(nodes, match):
    with pytest.raises(PartyError, match=match):
        handshake(FakeGrid(nodes), ["a", "b", "c"], "/job", timeout=1)


def test_an_answer_without_a_party_is_refused_naming_the_node():
    with pytest.raises(
        PartyError, match="node 2 failed the handshake: it answered query.hello without naming its party"
    ):
        handshake(FakeGrid({1: "a", 2: None, 3: "c"}), ["a", "b", "c"], "/job", timeout=1)


def test_a_silent_node_is_waited_for_until_the_timeout_and_counted():
    grid = FakeGrid({1: "a", 2: "b", 3: ""})  # node 3 never answers (its party would be c)
    t0 = time.monotonic()
    with pytest.raises(PartyError, match=r"missing \['c'\].*1 node\(s\) did not answer query.hello within 0.5 s"):
        handshake(grid, ["a", "b", "c"], "/job", timeout=0.5)
    assert 0.5 <= time.monotonic() - t0 < 2


class Clock:
    """time.monotonic / time.sleep on a fake clock that only sleeping moves; records the pauses."""

    def __init__(self) -> None:
        self.now, self.pauses = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


class LateGrid:
    """Replies to message ``id`` come with pull number ``arrive_at[id]`` (1 = the first pull)."""

    def __init__(self, arrive_at: dict[str, int]) -> None:
        self.arrive_at, self.pulls = arrive_at, 0

    def pull_messages(self, ids):
        self.pulls += 1
        return [
            SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))
            for i in ids
            if self.arrive_at[i] <= self.pulls
        ]


@pytest.fixture
def clock(monkeypatch):
    from app import transport

    fake = Clock()
    monkeypatch.setattr(transport, "time", fake)
    return fake


def test_polls_back_off_to_the_cap_and_reset_when_a_reply_comes(clock):
    from app.transport import POLL, POLL_MAX, pull_replies

    grid, got = LateGrid({"a": 13, "b": 15}), []
    assert pull_replies(grid, ["a", "b"], deadline=100.0, on_reply=got.append) == set()
    assert [r.metadata.reply_to_message_id for r in got] == ["a", "b"] and grid.pulls == 15
    ramp = [POLL * 1.5**k for k in range(10)]  # 5 ms .. 192 ms, then held at the cap
    assert ramp[-1] < POLL_MAX < ramp[-1] * 1.5
    # 12 pauses before a's pull, then back to POLL (b is near), none after b's
    assert clock.pauses == pytest.approx(ramp + [POLL_MAX, POLL_MAX] + [POLL, POLL * 1.5])


def test_a_deadline_ends_the_wait_with_a_last_pull_at_it_and_no_error(clock):
    from app.transport import pull_replies

    grid, got = LateGrid({"a": 2, "b": 10**6}), []
    missing = pull_replies(grid, ["a", "b"], deadline=1.0, on_reply=got.append)
    assert missing == {"b"} and len(got) == 1
    assert clock.now == pytest.approx(1.0) and sum(clock.pauses) == pytest.approx(1.0)  # no pause past it
    assert clock.pauses[-1] < 0.25  # the last pause is cut at the deadline
    assert grid.pulls == len(clock.pauses) + 1  # a pull after every pause, the last one at the deadline


def test_a_passed_deadline_still_pulls_once(clock):
    from app.transport import pull_replies

    grid, got = LateGrid({"a": 1, "b": 2}), []
    assert pull_replies(grid, ["a", "b"], deadline=-1.0, on_reply=got.append) == {"b"}
    assert grid.pulls == 1 and clock.pauses == [] and len(got) == 1
