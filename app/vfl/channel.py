"""The primary's channel to the secondaries over Flower messages, with byte and time accounting."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from app import messages
from app.kept import ATTEMPT_KEYS, attempt_fields, kept_attempts
from app.transport import PartyError, Traffic, payload_bytes, pull_replies, run_name
from strategies.vfl.wire import GradBlock


@dataclass(frozen=True)
class _Sent:
    """Messages pushed and not yet pulled."""

    message_type: str
    down: dict[str, int]  # party -> the array bytes sent to it
    ids: list[str]
    t0: float


class FlowerChannel:
    """The contract of strategies/vfl/channel.py over Flower's messages: each party is elsewhere
    and keeps its own state; gradient blocks travel as host arrays."""

    tensors = False
    parties: dict = {}  # no party objects in this process

    def __init__(self, grid: Grid, nodes: dict[str, int], timeout: float, job_id: str = "") -> None:
        self.grid, self.nodes, self.timeout, self.job_id = grid, nodes, timeout, job_id
        self.traffic = Traffic()
        self.cursor = {p: 0 for p in nodes}  # gradient blocks each party has applied
        self.saved: dict[str, dict] = {}  # the parties' last checkpoint (saved inside a step)
        self._keep: tuple[str, int, str, str] | None = None  # (run, epoch, attempt, previous): with the next step

    def _exchange(self, message_type: str, contents: dict[str, RecordDict]) -> dict[str, RecordDict]:
        return self._pull(self._push(message_type, contents))

    def _push(self, message_type: str, contents: dict[str, RecordDict]) -> "_Sent":
        msgs = [Message(c, dst_node_id=self.nodes[p], message_type=message_type) for p, c in contents.items()]
        t0 = time.perf_counter()
        down = {p: payload_bytes(c) for p, c in contents.items()}
        return _Sent(message_type, down, list(self.grid.push_messages(msgs)), t0)

    def _pull(self, sent: "_Sent") -> dict[str, RecordDict]:
        """Pull under the shared poll policy (app/transport.py:pull_replies) until every reply is
        in or the timeout passes; a party that did not answer or failed is named."""
        replies: list[Message] = []
        pull_replies(self.grid, sent.ids, time.monotonic() + self.timeout, replies.append)
        by_node = {r.metadata.src_node_id: r for r in replies}
        out = {}
        for party, node in self.nodes.items():
            if party not in sent.down:
                continue
            reply = by_node.get(node)
            if reply is None:
                raise PartyError(
                    f"party {party!r} (node {node}) did not answer {sent.message_type} within {self.timeout} s"
                )
            if reply.has_error():
                raise PartyError(f"party {party!r} failed on {sent.message_type}: {reply.error.reason}")
            out[party] = reply.content
        self._account(sent, {p: payload_bytes(c) for p, c in out.items()})
        return out

    def _account(self, sent: "_Sent", up: dict[str, int]) -> None:
        """One exchange in the traffic record: its time since the push (pipelined: including the
        overlapped compute) and its array bytes each way (``up``: party -> the reply's)."""
        self.traffic.seconds.append(time.perf_counter() - sent.t0)
        self.traffic.exchanges += 1
        for party, n in up.items():
            self.traffic.bytes_down += sent.down[party]
            self.traffic.bytes_up += n

    def step(
        self,
        apply: dict[str, list[GradBlock]],
        embed: dict[str, np.ndarray],
        save: tuple[str, int] | None = None,
        lr_scale: float = 1.0,
    ) -> dict[str, messages.StepReply]:
        """``save`` = (<run dir>/checkpoint, epoch): each party checkpoints into its own folder
        for the run; only the run's name travels (app/node.py:checkpoint_dir)."""
        return self.receive(self.send(apply, embed, save, lr_scale))

    def send(
        self,
        apply: dict[str, list[GradBlock]],
        embed: dict[str, np.ndarray],
        save: tuple[str, int] | None = None,
        lr_scale: float = 1.0,
    ) -> tuple["_Sent", bool]:
        run = (run_name(Path(save[0]).parent), save[1]) if save else None
        keep, self._keep = self._keep, None
        sent = self._push_steps(
            {
                p: messages.StepRequest.build(apply[p], embed[p], self.job_id, self.cursor[p], lr_scale, run, keep)
                for p in embed
            }
        )
        for p in embed:
            self.cursor[p] += len(apply[p])
        return sent, save is not None

    def receive(self, request: tuple["_Sent", bool]) -> dict[str, messages.StepReply]:
        sent, saving = request
        replies = self._pull_steps(sent)
        if saving:
            self.saved = {p: r.state for p, r in replies.items()}
        return replies

    def _push_steps(self, requests: dict[str, messages.StepRequest]) -> "_Sent":
        return self._push("train.step", {p: messages.step_content(r) for p, r in requests.items()})

    def _pull_steps(self, sent: "_Sent") -> dict[str, messages.StepReply]:
        return {p: messages.read_reply(c, p) for p, c in self._pull(sent).items()}

    def ping(self) -> float:
        """One empty exchange with every party: Flower's own floor per exchange."""
        t0 = time.perf_counter()
        self._exchange("query.ping", {p: RecordDict() for p in self.nodes})
        self.traffic.exchanges -= 1
        self.traffic.seconds.pop()
        return time.perf_counter() - t0

    def restore(self, folder: str, epoch: int) -> dict[str, dict]:
        """Every party loads its checkpoint of ``epoch`` from its own folder for the run
        (``folder`` = <run dir>/checkpoint; only the run's name travels)."""
        content = messages.named_content("state", run=run_name(Path(folder).parent), epoch=epoch)
        replies = self._exchange("query.restore", {p: content for p in self.nodes})
        states = {p: _restored(c, p) for p, c in replies.items()}
        self.cursor = {p: s["applied"] for p, s in states.items()}
        return states

    def keep(self, run_dir: Path, epoch: int) -> None:
        """The epoch just evaluated is the best so far: every party keeps its state (the one the
        evaluation embedded with) in its own folder for the run; only the run's name travels.
        It rides on the next step, which each party reads before applying that step's blocks
        (no exchange of its own: a deployed exchange costs seconds); :meth:`flush_keep` sends it
        alone when no step follows."""
        self._keep = (run_name(run_dir), epoch, *kept_attempts(run_dir, make=True).values())

    def flush_keep(self) -> None:
        """A keep no step carried (the run's last best epoch): its own exchange."""
        if self._keep is None:
            return
        (name, epoch, *attempts), self._keep = self._keep, None
        attempts = attempt_fields(dict(zip(ATTEMPT_KEYS, attempts)))
        self._exchange(
            "query.keep",
            {
                p: messages.named_content("keep", run=name, epoch=epoch, applied=self.cursor[p], **attempts)
                for p in self.nodes
            },
        )

    def embed_kept(self, run: str, tokens: dict[str, np.ndarray], attempt: str) -> dict[str, np.ndarray]:
        """Predict: each party's embeddings (T, c) of its tokens (T,) from its kept model of ``run``'s
        training ``attempt`` (app/kept.py kept_attempt)."""
        contents = {p: messages.kept_embed_content(run, self.job_id, t, attempt) for p, t in tokens.items()}
        replies = self._exchange("query.embed_kept", contents)
        return {p: messages.read_reply(c, p, "query.embed_kept").emb for p, c in replies.items()}

    def close(self) -> None:
        """Nothing to release: the Flower connection is the ServerApp's."""

    def finish(self, folder: str) -> dict[str, dict]:
        """Every party saves its final model into its own folder for the run (``folder`` = the
        primary's run dir; only its name travels). Returns what each party measured of its own
        exposure (the primary's feature inversion against it, app/vfl/exchange.py), if it did."""
        self.flush_keep()
        attempts = attempt_fields(kept_attempts(Path(folder)))  # the kept states that stay
        content = messages.named_content("finish", run=run_name(Path(folder)), **attempts)
        replies = self._exchange("query.finish", {p: content for p in self.nodes})
        return {p: messages.read_exposure(r, p) for p, r in replies.items() if "exposure" in r.config_records}


def _restored(content: RecordDict, party: str) -> dict:
    """A query.restore reply's {"digest", "applied"}, refused naming the party unless it holds them."""
    who = f"party {party!r}'s query.restore reply"
    state = content.config_records.get("state")
    if state is None:
        raise messages.ProtocolError(f"{who} holds no 'state' record")
    return {"digest": messages.read_text(state, "digest", who), "applied": messages.read_count(state, "applied", who)}
