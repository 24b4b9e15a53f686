"""The primary's channel to the secondaries (the EA paper's host and guests) over Flower messages
(Algorithm 1's send / collect with a deadline), plus the primary's own block in process; byte
accounting as in app/vfl/channel.py. The contract is strategies/entity_aug/channel.py."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from app.entity_aug import parties as wire
from app.kept import attempt_fields, kept_attempts
from app.messages import named_content
from app.transport import PartyError, Traffic, payload_bytes, pull_replies, run_name
from strategies.entity_aug.channel import LocalChannel, StepReply, StepRequest
from strategies.entity_aug.secondary import SecondaryParty


class FlowerChannel:
    """The secondaries behind Flower nodes (plus the primary's own block, if any, in process)."""

    def __init__(self, grid: Grid, nodes: dict[str, int], patience: float, local: dict[str, SecondaryParty]) -> None:
        self.grid, self.nodes, self.patience = grid, nodes, patience
        self.local = LocalChannel(local)
        self.parties = sorted(nodes) + self.local.parties
        self.traffic = Traffic()
        self._pending: dict[str, str] = {}  # party -> id of its outstanding message

    def send(self, party: str, request: StepRequest) -> None:
        if party in self.local.members:
            self.local.send(party, request)
            return
        content = wire.request_content(request)
        msg = Message(content, dst_node_id=self.nodes[party], message_type="train.ea_step")
        (self._pending[party],) = self.grid.push_messages([msg])
        self.traffic.bytes_down += payload_bytes(content)

    def _pull(self, wanted: dict[str, str], until: float, what: str) -> dict[str, RecordDict]:
        """message id -> party; the replies that arrive by ``until`` under the shared poll policy
        (app/transport.py:pull_replies), at least one pull even if ``until`` has passed; a missing
        one is left out, not an error (collect's deadline), a secondary's error raises at once."""
        out: dict[str, RecordDict] = {}

        def take(reply: Message) -> None:
            party = wanted[reply.metadata.reply_to_message_id]
            if reply.has_error():
                raise PartyError(f"secondary {party!r} failed on {what}: {reply.error.reason}")
            out[party] = reply.content
            self.traffic.bytes_up += payload_bytes(reply.content)

        pull_replies(self.grid, list(wanted), until, take)
        return out

    def collect(self, parties: set[str], until: float) -> dict[str, StepReply]:
        out = self.local.collect(parties & set(self.local.members), until)
        wanted = {self._pending[p]: p for p in parties if p in self._pending}
        for party, content in self._pull(wanted, until, "ea_step").items():
            del self._pending[party]
            out[party] = wire.read_reply(content, party)
        return out

    def attach_local(self, local: dict[str, SecondaryParty]) -> None:
        """The primary's own block, built once the run's entities are known (after an id exchange)."""
        self.local = LocalChannel(local)
        self.parties = sorted(self.nodes) + self.local.parties

    def _ask_all(self, message_type: str, content: RecordDict) -> dict[str, RecordDict]:
        return self.ask_each(message_type, {p: content for p in self.nodes})

    def ask_each(self, message_type: str, contents: dict[str, RecordDict]) -> dict[str, RecordDict]:
        """Every secondary's answer to its own ``contents[party]``; one missing within the patience is an error."""
        msgs = {p: Message(contents[p], dst_node_id=n, message_type=message_type) for p, n in self.nodes.items()}
        ids = self.grid.push_messages(list(msgs.values()))
        self.traffic.bytes_down += sum(payload_bytes(c) for c in contents.values())
        got = self._pull(dict(zip(ids, msgs)), time.monotonic() + self.patience, message_type)
        missing = sorted(set(self.nodes) - set(got))
        if missing:
            raise PartyError(f"secondary {missing[0]!r} did not answer {message_type} within {self.patience} s")
        return got

    def embed(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        got = self._ask_all("query.ea_embed", wire.ids_content(ids))
        return {**{p: wire.read_act(c, p) for p, c in got.items()}, **self.local.embed(ids)}

    def keep(self, folder: str, epoch: int) -> None:
        """Every secondary keeps its state of ``epoch`` (just evaluated, the best so far) in its own folder."""
        attempts = attempt_fields(kept_attempts(Path(folder), make=True))  # the secondaries keep under them
        self._ask_all(
            "query.ea_keep", named_content("ea_keep", run=run_name(Path(folder)), epoch=int(epoch), **attempts)
        )

    def embed_kept(self, run: str, ids: np.ndarray, attempt: str) -> dict[str, np.ndarray]:
        """Predict: every secondary's activations (q, c_p) of ``ids`` from the state it kept for
        ``run``'s training ``attempt`` (plus the primary's own block, in process, from the
        primary's kept state)."""
        got = self._ask_all("query.ea_embed_kept", wire.kept_request_content(run, ids, attempt))
        return {**{p: wire.read_act(c, p) for p, c in got.items()}, **self.local.embed(ids)}

    def close(self) -> None:
        """Nothing of Flower's to release (the connection is the ServerApp's); the primary's own
        block's channel, in process."""
        self.local.close()

    def finish(self, folder: str) -> None:
        """Every secondary saves its model into its own folder for the run (``folder`` = the
        primary's run dir; only its name travels)."""
        attempts = attempt_fields(kept_attempts(Path(folder)))  # the kept states that stay
        self._ask_all("query.ea_finish", named_content("ea_finish", run=run_name(Path(folder)), **attempts))
