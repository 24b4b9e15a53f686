"""The Flower transport both training modes share: the handshake that maps parties to nodes
(an introduction, then the parties' own names mapped to their nodes),
pushing messages and pulling their replies under one poll policy, and byte accounting.
The modes' channels (app/vfl/channel.py, app/entity_aug/channel.py) speak through it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from app import messages

POLL = 0.005  # seconds between the first pulls of replies; then backing off x BACKOFF up to POLL_MAX
POLL_MAX = 0.25  # a deployed exchange takes seconds: do not hammer the SuperLink (2 cores here)
BACKOFF = 1.5  # an exchange waited for t s is pulled again within ~t/2 s more (until POLL_MAX)


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


def pull_replies(grid: Grid, ids: Iterable[str], deadline: float, on_reply: Callable[[Message], None]) -> set[str]:
    """The one poll policy of both modes' channels: pull the replies to ``ids`` (pushed already),
    handing each to ``on_reply`` as it comes, until all are in or ``deadline`` (time.monotonic())
    passes; returns the ids still unanswered (never raises for them: the caller decides, and
    Entity Augmentation's collect with a deadline takes what arrived). An exception from
    ``on_reply`` (a party's error) ends the wait at once.

    Pull at once, then pause POLL, POLL*1.5, ... up to POLL_MAX between pulls; no pause ends past
    the deadline, and a last pull is made at the deadline. Grid.send_and_receive instead sleeps
    0.1 s between pulls (3 s in deployment), up to one more tick on an exchange whose reply comes
    just after a pull.

    The pause goes back to POLL after a pull that brought a reply. The parties of an exchange
    start together on work of a like size, so their replies come in a cluster: the first one is
    the best sign the rest are near, and a pause grown while the slowest party worked would add
    up to POLL_MAX to every exchange that still waits for one. The cost is bounded: each reset
    adds at most the ~10 pulls of one ramp from POLL to POLL_MAX (~0.6 s), and there is at most
    one per party and exchange. With one party (hdb) it never applies."""
    pending = set(ids)
    pause = POLL
    while pending:
        for reply in grid.pull_messages(list(pending)):
            pending.discard(reply.metadata.reply_to_message_id)
            pause = POLL  # a reply came: the others are likely near (see above)
            on_reply(reply)
        left = deadline - time.monotonic()
        if not pending or left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(POLL_MAX, pause * BACKOFF)
    return pending


def run_name(run_dir: Path) -> str:
    """The name of the primary's run folder, the only part of it a message carries."""
    return messages.plain_name(Path(run_dir).name, "run name", "the primary's run folder")


@dataclass
class Introductions:
    """The nodes' answers to an introduction (``query.<action>``): each answering node's record
    of that name, the nodes that failed it (node -> reason), how many did not answer in time, and
    each answering node's whole reply (an answer may carry arrays: app/entity_aug/id_exchange.py)."""

    records: dict[int, ConfigRecord]
    failed: dict[int, str]
    silent: int
    contents: dict[int, RecordDict] = field(default_factory=dict)


def introduce(
    grid: Grid, parties: list[str], timeout: float, action: str, content_for: Callable[[int], RecordDict]
) -> Introductions:
    """Ask every connected node ``query.<action>`` (the content ``content_for(node id)``), once
    as many nodes as parties are connected or ``timeout`` passes, and wait for the answers under
    the channels' poll policy (Grid.send_and_receive sleeps 3 s between pulls in deployment)."""
    deadline = time.monotonic() + timeout
    node_ids = list(grid.get_node_ids())
    while len(node_ids) < len(parties) and time.monotonic() < deadline:
        time.sleep(0.5)
        node_ids = list(grid.get_node_ids())
    if not node_ids:
        raise PartyError(f"no SuperNode connected within {timeout} s; expected parties {parties}")
    msgs = [Message(content_for(nid), dst_node_id=nid, message_type=f"query.{action}") for nid in node_ids]
    replies: list[Message] = []
    silent = pull_replies(grid, grid.push_messages(msgs), time.monotonic() + timeout, replies.append)
    failed = {r.metadata.src_node_id: r.error.reason for r in replies if r.has_error()}
    records = {r.metadata.src_node_id: r.content.config_records.get(action) for r in replies if not r.has_error()}
    for node_id in [n for n, rec in records.items() if rec is None or "party" not in rec]:
        failed[node_id] = f"it answered query.{action} without naming its party"  # another app version, say
        del records[node_id]
    contents = {r.metadata.src_node_id: r.content for r in replies if r.metadata.src_node_id in records}
    return Introductions(records, failed, len(silent), contents)


def party_nodes(met: Introductions, parties: list[str], action: str, timeout: float) -> dict[str, int]:
    """party -> node id from the parties' own answers (their node config names them), refusing a
    failed node and a missing or duplicated party. Node ids are never assumed to follow any order."""
    if met.failed:
        raise PartyError(
            "; ".join(f"node {node_id} failed the handshake: {why}" for node_id, why in met.failed.items())
        )
    nodes: dict[str, int] = {}
    for node_id, record in met.records.items():
        party = str(record["party"])
        if party in nodes:
            raise PartyError(f"party {party!r} is played by two nodes ({nodes[party]} and {node_id})")
        nodes[party] = node_id
    missing = sorted(set(parties) - set(nodes))
    extra = sorted(set(nodes) - set(parties))
    if missing or extra:
        quiet = f"; {met.silent} node(s) did not answer query.{action} within {timeout} s" if met.silent else ""
        raise PartyError(f"party set mismatch: missing {missing}, unexpected {extra} (expected {parties}){quiet}")
    return nodes


def handshake(grid: Grid, parties: list[str], job_id: str, timeout: float, *, action: str = "hello") -> dict[str, int]:
    """Ask every connected node which party it is (``query.<action>``, answered in a record of
    that name); map party -> node id. ``job_id`` names the linkage job (each party reads its own
    copy); Entity Augmentation's secondaries answer ``query.ea_hello``, which names none ("")."""
    met = introduce(
        grid,
        parties,
        timeout,
        action,
        lambda _: messages.named_content(action, **({"job_id": job_id} if job_id else {})),
    )
    return party_nodes(met, parties, action, timeout)
