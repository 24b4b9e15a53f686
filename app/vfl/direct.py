"""The primary's channel over the direct transport (run config ``transport = "direct"``): the
same protocol as :class:`~app.vfl.channel.FlowerChannel`, its messages carried by an encrypted,
authenticated link to each secondary's party worker (app/vfl/worker.py, app/secure_link.py)
instead of one Flower exchange each. Flower introduces the parties and hands each worker its
run key; the link then moves the tensors in milliseconds, not seconds."""

from __future__ import annotations

import socket
import time

from flwr.app import RecordDict

from app import messages
from app.secure_link import LinkError, SecureLink, new_key
from app.transport import PartyError
from app.vfl.channel import FlowerChannel, _Sent
from app.vfl.worker import decode, encode


class DirectChannel(FlowerChannel):
    """A FlowerChannel whose pushes and pulls go over the parties' direct links, in order."""

    def __init__(self, flower: FlowerChannel, links: dict[str, SecureLink]) -> None:
        super().__init__(flower.grid, flower.nodes, flower.timeout, flower.job_id)
        self.traffic = flower.traffic  # the opening exchange counts
        self.links, self._seq = links, 0

    @classmethod
    def open(cls, flower: FlowerChannel) -> "DirectChannel":
        """Over Flower, each party starts its worker with a fresh key drawn here for it; then the
        primary connects, both sides prove they hold the key, and the worker says hello."""
        keys = {p: new_key() for p in flower.nodes}
        replies = flower._exchange("query.direct_open", {p: messages.named_content("direct", key=keys[p])
                                                          for p in flower.nodes})
        links: dict[str, SecureLink] = {}
        try:
            for p, content in sorted(replies.items()):
                address = str(content.config_records.get("direct", {}).get("address", ""))
                try:
                    links[p] = SecureLink.connect(address, keys[p], flower.timeout)
                except (LinkError, OSError, ValueError) as e:
                    raise PartyError(f"party {p!r}: no direct link to its worker at {address!r}: {e}") from e
            channel = cls(flower, links)
            channel._exchange("query.hello", {p: messages.named_content("hello", job_id=flower.job_id) for p in links})
            return channel
        except BaseException:
            for link in links.values():
                link.close()
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
