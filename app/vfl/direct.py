"""The primary's channel over the direct transport (run config ``transport = "direct"``): the
same protocol as :class:`~app.vfl.channel.FlowerChannel`, its messages carried by an encrypted,
authenticated link to each secondary's party worker (app/vfl/worker.py, app/secure_link.py)
instead of one Flower exchange each. Flower introduces the parties and hands each worker its
run key in the same exchange that names the parties; the link then moves the tensors in
milliseconds, not seconds."""

from __future__ import annotations

import socket
import time

from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from app import messages
from app.secure_link import LinkError, SecureLink, new_key
from app.transport import PartyError, introduce, party_nodes
from app.vfl.channel import FlowerChannel, _Sent
from app.vfl.worker import decode, encode


class DirectChannel(FlowerChannel):
    """A FlowerChannel whose pushes and pulls go over the parties' direct links, in order."""

    def __init__(self, flower: FlowerChannel, links: dict[str, SecureLink]) -> None:
        super().__init__(flower.grid, flower.nodes, flower.timeout, flower.job_id)
        self.traffic = flower.traffic  # one account of exchanges and bytes, whichever way they went
        self.links, self._seq = links, 0

    @classmethod
    def connect(cls, grid: Grid, parties: list[str], job_id: str, timeout: float) -> "DirectChannel":
        """The handshake and the links in one Flower exchange: each node gets a fresh key drawn
        here for it, starts its party worker with it and answers its party (from its own node
        config) and the worker's address. The primary then connects to each, both sides prove
        they hold the key, and the worker says hello, checking the linkage job. A worker not
        used (a refused party set, a failed link) is released at once, not left waiting."""
        keys: dict[int, str] = {}

        def content_for(node_id: int) -> RecordDict:
            keys[node_id] = new_key()
            return messages.named_content("direct_open", key=keys[node_id])

        met = introduce(grid, parties, timeout, "direct_open", content_for)
        links: dict[str, SecureLink] = {}
        nodes: dict[str, int] = {}
        try:
            nodes = party_nodes(met, parties, "direct_open", timeout)
            for p, node_id in sorted(nodes.items()):
                address = str(met.records[node_id].get("address", ""))
                try:
                    links[p] = SecureLink.connect(address, keys[node_id], timeout)
                except (LinkError, OSError, ValueError) as e:
                    raise PartyError(f"party {p!r}: no direct link to its worker at {address!r}: {e}") from e
            channel = cls(FlowerChannel(grid, nodes, timeout, job_id), links)
            channel._exchange("query.hello", {p: messages.named_content("hello", job_id=job_id) for p in links})
            return channel
        except BaseException:
            for link in links.values():
                link.close()
            linked = {nodes[p] for p in links}
            _release({n: rec for n, rec in met.records.items() if n not in linked}, keys)
            raise

    def _push(self, message_type: str, contents: dict[str, RecordDict]) -> _Sent:
        t0, ids = time.perf_counter(), []
        for party, content in contents.items():
            self._seq += 1
            try:
                self.links[party].settimeout(self.timeout)
                self.links[party].send(b"Q", self._seq, message_type, encode(content))
            except OSError as e:
                raise PartyError(f"party {party!r}: the direct link failed sending {message_type}: {e}") from e
            ids.append(f"{party}:{self._seq}")
        return _Sent(message_type, contents, ids, t0)

    def _pull(self, sent: _Sent) -> dict[str, RecordDict]:
        """Each party's reply to ``sent``, in the order the requests went (a link is FIFO)."""
        out = {}
        for sent_id in sent.ids:
            party, seq = sent_id.rsplit(":", 1)
            out[party] = self._reply(party, int(seq), sent)
        self._account(sent, out)
        return out

    def _reply(self, party: str, seq: int, sent: _Sent) -> RecordDict:
        try:  # the whole reply within the timeout, as Flower's pull has it, however it trickles in
            kind, got, message_type, body = self.links[party].recv(time.monotonic() + self.timeout)
        except (socket.timeout, TimeoutError) as e:
            raise PartyError(f"party {party!r} did not answer {sent.message_type} within {self.timeout} s") from e
        except (LinkError, OSError) as e:
            raise PartyError(f"party {party!r}: the direct link failed on {sent.message_type}: {e}") from e
        if (got, message_type) != (seq, sent.message_type):
            raise PartyError(f"party {party!r} answered {message_type} #{got}, expected {sent.message_type} #{seq}")
        if kind == b"E":
            raise PartyError(f"party {party!r} failed on {sent.message_type}: {body.decode(errors='replace')}")
        if kind != b"R":
            raise PartyError(f"party {party!r} sent {kind!r} where a reply was due")
        try:
            return decode(body)
        except Exception as e:  # protobuf's DecodeError and kin: never unnamed
            raise PartyError(f"party {party!r} sent a {sent.message_type} reply that does not parse: {e}") from e

    def close(self) -> None:
        for link in self.links.values():
            link.close()


def _release(records: dict[int, ConfigRecord], keys: dict[int, str], timeout: float = 5.0) -> None:
    """Connect to each of these workers and close the link: a worker ends with its link, where
    it would otherwise wait node-timeout for a primary that is not coming."""
    for node_id, record in records.items():
        try:
            SecureLink.connect(str(record.get("address", "")), keys[node_id], timeout).close()
        except (LinkError, OSError, ValueError):
            pass  # gone already, or never listening: nothing to release
