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
from app.direct_links import close_all, open_links, read_reply, send_request
from app.secure_link import SecureLink
from app.vfl.channel import FlowerChannel, _Sent


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
        t0, ids = time.perf_counter(), []
        for party, content in contents.items():
            self._seq += 1
            send_request(self.links[party], party, self._seq, message_type, content, self.timeout)
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
        return read_reply(self.links[party], party, seq, sent.message_type, self.timeout)

    def close(self) -> None:
        close_all(self.links)
