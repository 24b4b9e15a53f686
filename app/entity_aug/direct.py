"""The primary's channel to Entity Augmentation's secondaries over the direct transport (run
config ``transport = "direct"``, the default): the contract of app/entity_aug/channel.py, its
requests carried by each secondary's encrypted, authenticated link to its party worker
(app/direct_links.py, app/party_worker.py) instead of one Flower exchange each. Algorithm 1's
deadline holds as over Flower: a step whose reply has not begun to arrive by ``until`` is left
out (the queue's fallback), and a party still busy gets no new request, so each link carries at
most one outstanding step and its late reply is the next one read."""

from __future__ import annotations

import select
import time

from flwr.app import RecordDict
from flwr.serverapp import Grid

from app.direct_links import close_all, open_links, read_packed, read_reply, send_request
from app.entity_aug.channel import FlowerChannel
from app.messages import named_content
from app.secure_link import SecureLink
from app.transport import payload_bytes
from strategies.entity_aug.channel import StepReply, StepRequest
from strategies.entity_aug.secondary import SecondaryParty
from strategies.wire_bytes import array_bytes, pack

STEP = "train.ea_step"


class DirectChannel(FlowerChannel):
    """The secondaries behind their direct links (plus the primary's own block, if any, in process)."""

    def __init__(
        self, grid: Grid, nodes: dict[str, int], patience: float, local: dict[str, SecondaryParty], links: dict
    ) -> None:
        super().__init__(grid, nodes, patience, local)
        self.links: dict[str, SecureLink] = links
        self._seq = 0
        self._waiting: dict[str, int] = {}  # party -> the sequence number of its outstanding step

    @classmethod
    def open(cls, grid: Grid, parties: list[str], patience: float, local: dict) -> "DirectChannel":
        """Start every secondary's worker and link to it, in one Flower exchange."""
        nodes, links = open_links(grid, parties, patience, "ea_direct_open")
        return cls(grid, nodes, patience, local, links)

    @classmethod
    def connect(cls, grid: Grid, parties: list[str], patience: float, local: dict) -> "DirectChannel":
        """:meth:`open`, then each worker builds its party on the link's hello (``query.ea_hello``, as over Flower)."""
        channel = cls.open(grid, parties, patience, local)
        try:
            channel._ask_all("query.ea_hello", named_content("ea_hello"))
            return channel
        except BaseException:
            channel.close()
            raise

    def _send(self, party: str, message_type: str, body: RecordDict | bytes, down: int) -> int:
        """Request the next sequence number of the party (``body`` a RecordDict or packed), its
        ``down`` array bytes counted."""
        self._seq += 1
        send_request(self.links[party], party, self._seq, message_type, body, self.patience)
        self.traffic.bytes_down += down
        return self._seq

    def _read(self, party: str, seq: int, message_type: str) -> RecordDict:
        content = read_reply(self.links[party], party, seq, message_type, self.patience)
        self.traffic.bytes_up += payload_bytes(content)
        return content

    def send(self, party: str, request: StepRequest) -> None:
        """A step's request packed without Flower's records (strategies/wire_bytes.py)."""
        if party in self.local.members:
            self.local.send(party, request)
            return
        arrays, fields = request.encode()
        self._waiting[party] = self._send(party, STEP, pack((arrays, fields)), array_bytes(arrays))

    def _reply(self, party: str) -> StepReply:
        arrays, fields = read_packed(self.links[party], party, self._waiting.pop(party), STEP, self.patience)
        self.traffic.bytes_up += array_bytes(arrays)
        return StepReply.decode(arrays, fields, party)

    def collect(self, parties: set[str], until: float) -> dict[str, StepReply]:
        """The replies that begin to arrive by ``until`` (each then read whole within the
        patience); a party whose reply has not begun is left out, as over Flower."""
        out = self.local.collect(parties & set(self.local.members), until)
        for party in sorted(p for p in parties if p in self._waiting):
            ready, _, _ = select.select([self.links[party].sock], [], [], max(0.0, until - time.monotonic()))
            if ready:
                out[party] = self._reply(party)
        return out

    def ask_each(self, message_type: str, contents: dict[str, RecordDict]) -> dict[str, RecordDict]:
        asked = {p: self._send(p, message_type, contents[p], payload_bytes(contents[p])) for p in sorted(self.nodes)}
        return {p: self._read(p, seq, message_type) for p, seq in asked.items()}

    def close(self) -> None:
        close_all(self.links)
        super().close()
