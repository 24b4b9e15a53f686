"""The Flower transport both training modes share: the handshake that maps parties to nodes,
pushing messages and pulling their replies under one poll policy, and byte accounting.
The modes' channels (app/vfl/channel.py, app/entity_aug/channel.py) speak through it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from app import messages

POLL = 0.005  # seconds before the first pull of replies; then backing off x1.5 up to POLL_MAX
POLL_MAX = 0.25  # a deployed exchange takes seconds: do not hammer the SuperLink (2 cores here)


class PartyError(RuntimeError):
    """A secondary failed, did not answer in time, or the party set is wrong."""


@dataclass
class Traffic:
    exchanges: int = 0
    bytes_down: int = 0  # primary -> secondaries
    bytes_up: int = 0  # secondaries -> primary
    seconds: list[float] = field(default_factory=list)


def payload_bytes(content: RecordDict) -> int:
    """Bytes of array data in a message (what the protocol moves; headers excluded)."""
    return sum(len(a.data) for rec in content.array_records.values() for a in rec.values())


def run_name(run_dir: Path) -> str:
    """The name of the primary's run folder, the only part of it a message carries."""
    return messages.plain_name(Path(run_dir).name, "run name", "the primary's run folder")


def handshake(grid: Grid, parties: list[str], job_id: str, timeout: float, *, action: str = "hello") -> dict[str, int]:
    """Ask every connected node which party it is (``query.<action>``, answered in a record of
    that name); map party -> node id, refusing a missing or duplicated party. Node ids are never
    assumed to follow any order. ``job_id`` names the linkage job (each party reads its own
    copy); Entity Augmentation's guests answer ``query.ea_hello``, which names none ("")."""
    deadline = time.monotonic() + timeout
    node_ids = list(grid.get_node_ids())
    while len(node_ids) < len(parties) and time.monotonic() < deadline:
        time.sleep(0.5)
        node_ids = list(grid.get_node_ids())
    if not node_ids:
        raise PartyError(f"no SuperNode connected within {timeout} s; expected parties {parties}")
    hello = [Message(messages.named_content(action, **({"job_id": job_id} if job_id else {})), dst_node_id=nid,
                     message_type=f"query.{action}") for nid in node_ids]
    replies = list(grid.send_and_receive(hello, timeout=timeout))
    nodes: dict[str, int] = {}
    for reply in replies:
        if reply.has_error():
            raise PartyError(f"node {reply.metadata.src_node_id} failed the handshake: {reply.error.reason}")
        party = str(reply.content.config_records[action]["party"])
        if party in nodes:
            raise PartyError(f"party {party!r} is played by two nodes ({nodes[party]} and {reply.metadata.src_node_id})")
        nodes[party] = reply.metadata.src_node_id
    missing = sorted(set(parties) - set(nodes))
    extra = sorted(set(nodes) - set(parties))
    if missing or extra:
        raise PartyError(f"party set mismatch: missing {missing}, unexpected {extra} (expected {parties})")
    return nodes
