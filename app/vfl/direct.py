"""The primary's channel over the direct transport (run config ``transport = "direct"``): the
same protocol as :class:`~app.vfl.channel.FlowerChannel`, its messages carried by an encrypted,
authenticated link to each secondary's party worker (app/party_worker.py, app/secure_link.py)
instead of one Flower exchange each. Flower introduces the parties and hands each worker its
run key in the same exchange that names the parties; the link then moves the tensors in
milliseconds, not seconds."""

from __future__ import annotations

import time

from flwr.app import RecordDict
from flwr.serverapp import Grid

from app import messages
from app.direct_links import close_all, open_links, read_packed, read_reply, send_request
from app.secure_link import SecureLink
from app.transport import payload_bytes
from app.vfl.channel import FlowerChannel, _Sent
from strategies.wire_bytes import array_bytes, pack


class DirectChannel(FlowerChannel):
    """A FlowerChannel whose pushes and pulls go over the parties' direct links, in order."""

    def __init__(self, flower: FlowerChannel, links: dict[str, SecureLink]) -> None:
        super().__init__(flower.grid, flower.nodes, flower.timeout, flower.job_id)
        self.traffic = flower.traffic  # one account of exchanges and bytes, whichever way they went
        self.links, self._seq = links, 0

    @classmethod
    def connect(cls, grid: Grid, parties: list[str], job_id: str, timeout: float) -> "DirectChannel":
        """The handshake and the links in one Flower exchange (app/direct_links.py), then the
        worker says hello over its link, checking the linkage job."""
        nodes, links = open_links(grid, parties, timeout, "direct_open")
        try:
            channel = cls(FlowerChannel(grid, nodes, timeout, job_id), links)
            channel._exchange("query.hello", {p: messages.named_content("hello", job_id=job_id) for p in links})
            return channel
        except BaseException:
            close_all(links)
            raise

    def _push(self, message_type: str, contents: dict[str, RecordDict]) -> _Sent:
        return self._send(message_type, contents, {p: payload_bytes(c) for p, c in contents.items()})

    def _push_steps(self, requests: dict[str, messages.StepRequest]) -> _Sent:
        """Each party's step packed without Flower's records (strategies/wire_bytes.py)."""
        codecs = {p: r.encode() for p, r in requests.items()}
        down = {p: array_bytes(arrays) for p, (arrays, _) in codecs.items()}
        return self._send("train.step", {p: pack(c) for p, c in codecs.items()}, down)

    def _send(self, message_type: str, bodies: dict, down: dict[str, int]) -> _Sent:
        t0, ids = time.perf_counter(), []
        for party, body in bodies.items():
            self._seq += 1
            send_request(self.links[party], party, self._seq, message_type, body, self.timeout)
            ids.append(f"{party}:{self._seq}")
        return _Sent(message_type, down, ids, t0)

    def _pull(self, sent: _Sent) -> dict[str, RecordDict]:
        """Each party's reply to ``sent``, in the order the requests went (a link is FIFO)."""
        out = {
            party: read_reply(self.links[party], party, seq, sent.message_type, self.timeout)
            for party, seq in _order(sent)
        }
        self._account(sent, {p: payload_bytes(c) for p, c in out.items()})
        return out

    def _pull_steps(self, sent: _Sent) -> dict[str, messages.StepReply]:
        out, up = {}, {}
        for party, seq in _order(sent):
            arrays, fields = read_packed(self.links[party], party, seq, sent.message_type, self.timeout)
            up[party] = array_bytes(arrays)
            out[party] = messages.StepReply.decode(arrays, fields, party, sent.message_type)
        self._account(sent, up)
        return out

    def close(self) -> None:
        close_all(self.links)


def _order(sent: _Sent) -> list[tuple[str, int]]:
    """(party, sequence number) of each request of ``sent``, in the order they went."""
    return [(party, int(seq)) for party, seq in (sent_id.rsplit(":", 1) for sent_id in sent.ids)]
