"""The primary's handshake names parties by their own node config, never by node-id order."""

from types import SimpleNamespace

import pytest

from app.transport import PartyError, handshake


@pytest.fixture(autouse=True)
def run_identity(monkeypatch):
    """Flower's Message reads the run id of the process it runs in (set by a ServerApp)."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


class FakeGrid:
    """Nodes answering query.hello with the party name of their node config."""

    def __init__(self, parties_by_node: dict[int, str]) -> None:
        self.parties_by_node = parties_by_node

    def get_node_ids(self):
        return list(self.parties_by_node)

    def send_and_receive(self, msgs, timeout=None):
        assert len(msgs) == len(self.parties_by_node)  # one hello per connected node, in node order
        return [SimpleNamespace(has_error=lambda: False, metadata=SimpleNamespace(src_node_id=node),
                                content=SimpleNamespace(config_records={"hello": {"party": party}}))
                for node, party in reversed(self.parties_by_node.items())]  # replies come in any order


def test_parties_map_to_their_nodes_whatever_the_node_order():
    grid = FakeGrid({907: "c", 12: "a", 500: "b"})
    assert handshake(grid, ["a", "b", "c"], "/job", timeout=1) == {"a": 12, "b": 500, "c": 907}


@pytest.mark.parametrize("nodes,match", [
    ({1: "a", 2: "a", 3: "b"}, "party 'a' is played by two nodes"),
    ({1: "a", 2: "b"}, r"missing \['c'\]"),
    ({1: "a", 2: "b", 3: "c", 4: "d"}, r"unexpected \['d'\]"),
])
def test_a_twice_configured_missing_or_unknown_party_is_refused(nodes, match):
    with pytest.raises(PartyError, match=match):
        handshake(FakeGrid(nodes), ["a", "b", "c"], "/job", timeout=1)
