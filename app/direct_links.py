"""The direct transport's links, shared by both training modes (app/vfl/direct.py for FedSim,
app/entity_aug/direct.py for Entity Augmentation): Flower introduces the parties and hands each
node a fresh run key in one exchange (``query.<action>``, whose handler starts the node's party
worker, app/party_worker.py), the primary connects to each worker and both prove the key
(app/secure_link.py); then every request goes over its party's own link and every reply is
checked to answer it.

    open_links(grid, parties, timeout, action) -> ({party: node id}, {party: SecureLink})
    send_request(link, party, seq, message_type, content or packed body, timeout)
    read_reply(link, party, seq, message_type, timeout) -> RecordDict
    read_packed(link, party, seq, message_type, timeout) -> (arrays, fields) (a packed step's reply)
"""

from __future__ import annotations

import socket
import time

from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from app import messages
from app.party_worker import decode, encode
from app.secure_link import LinkError, SecureLink, new_key
from app.transport import PartyError, introduce, party_nodes
from strategies.wire_bytes import unpack


def open_links(grid: Grid, parties: list[str], timeout: float, action: str) -> tuple[dict, dict]:
    """({party: node id}, {party: link}): each node gets a fresh key drawn here for it, starts
    its party worker with it and answers its party (from its own node config) and the worker's
    address; the primary connects to each. A worker not linked (a refused party set, a failed
    link) is released at once, not left waiting for a primary that is not coming."""
    keys: dict[int, str] = {}

    def content_for(node_id: int) -> RecordDict:
        keys[node_id] = new_key()
        return messages.named_content(action, key=keys[node_id])

    met = introduce(grid, parties, timeout, action, content_for)
    links: dict[str, SecureLink] = {}
    nodes: dict[str, int] = {}
    try:
        nodes = party_nodes(met, parties, action, timeout)
        for p, node_id in sorted(nodes.items()):
            address = str(met.records[node_id].get("address", ""))
            try:
                links[p] = SecureLink.connect(address, keys[node_id], timeout)
            except (LinkError, OSError, ValueError) as e:
                raise PartyError(f"party {p!r}: no direct link to its worker at {address!r}: {e}") from e
        return nodes, links
    except BaseException:
        close_all(links)
        linked = {nodes[p] for p in links}
        _release({n: rec for n, rec in met.records.items() if n not in linked}, keys)
        raise


def send_request(
    link: SecureLink, party: str, seq: int, message_type: str, content: RecordDict | bytes, timeout: float
) -> None:
    """Request ``seq`` of ``message_type`` to the party over its link, sent within ``timeout``
    seconds: a RecordDict, or a body already packed (app/party_worker.py ``packed``); a failed
    send fails naming the party."""
    try:
        link.settimeout(timeout)
        link.send(b"Q", seq, message_type, content if isinstance(content, bytes) else encode(content))
    except OSError as e:
        raise PartyError(f"party {party!r}: the direct link failed sending {message_type}: {e}") from e


def read_reply(link: SecureLink, party: str, seq: int, message_type: str, timeout: float) -> RecordDict:
    """The party's reply to request ``seq`` of ``message_type`` (:func:`_read_body`) as a RecordDict."""
    body = _read_body(link, party, seq, message_type, timeout)
    try:
        return decode(body)
    except Exception as e:  # protobuf's DecodeError and kin: never unnamed
        raise PartyError(f"party {party!r} sent a {message_type} reply that does not parse: {e}") from e


def read_packed(link: SecureLink, party: str, seq: int, message_type: str, timeout: float) -> tuple[dict, dict]:
    """The party's reply packed without Flower's records (strategies/wire_bytes.py), refused
    naming the party unless it unpacks; its type's ``decode`` checks the rest."""
    return unpack(_read_body(link, party, seq, message_type, timeout), f"party {party!r}'s reply to {message_type}")


def _read_body(link: SecureLink, party: str, seq: int, message_type: str, timeout: float) -> bytes:
    """The body of the party's reply to request ``seq`` of ``message_type``, whole within
    ``timeout`` seconds however it trickles in (as Flower's pull has it); anything else fails
    naming the party."""
    try:
        kind, got, answered, body = link.recv(time.monotonic() + timeout)
    except (socket.timeout, TimeoutError) as e:
        raise PartyError(f"party {party!r} did not answer {message_type} within {timeout} s") from e
    except (LinkError, OSError) as e:
        raise PartyError(f"party {party!r}: the direct link failed on {message_type}: {e}") from e
    if (got, answered) != (seq, message_type):
        raise PartyError(f"party {party!r} answered {answered} #{got}, expected {message_type} #{seq}")
    if kind == b"E":
        raise PartyError(f"party {party!r} failed on {message_type}: {body.decode(errors='replace')}")
    if kind != b"R":
        raise PartyError(f"party {party!r} sent {kind!r} where a reply was due")
    return body


def close_all(links: dict[str, SecureLink]) -> None:
    for link in links.values():
        link.close()


def _release(records: dict[int, ConfigRecord], keys: dict[int, str], timeout: float = 5.0) -> None:
    """Connect to each of these workers and close the link: a worker ends with its link, where
    it would otherwise wait node-timeout for a primary that is not coming."""
    for node_id, record in records.items():
        try:
            SecureLink.connect(str(record.get("address", "")), keys[node_id], timeout).close()
        except (LinkError, OSError, ValueError):
            pass  # gone already, or never listening: nothing to release
