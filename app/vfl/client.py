"""ClientApp side of FedSim (``mode = "vfl"``): a secondary's handlers, one per protocol step,
registered in app/client_app.py as ``query.hello``, ``train.step``, ``query.keep``,
``query.finish`` and ``query.restore``; and for predict with the kept federation
``query.embed_kept``. The party lives in ``context.state`` between messages
(app/vfl/secondary.py). The messages that need no model (``query.direct_open``,
``query.predict_hello``, ``query.ping``) are app/vfl/handshake.py's.

The training steps are content handlers, (RecordDict, Context) -> RecordDict, made ClientApp
handlers by :func:`app.messages.flower`; the direct transport's party worker (app/party_worker.py) answers the
same ones (:data:`DIRECT`) over its own link."""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from app import messages, node, threads
from app.config import RunConfig
from app.kept import ATTEMPT_KEYS, drop_other_attempts, party_kept_file
from app.node import node_run_config
from app.party_worker import packed, records
from app.vfl import handshake
from app.vfl.secondary import MisalignedStep, SecondaryParty
from strategies.optim import party_seed
from strategies.vfl.wire import StepReply, StepRequest


def party_threads(cfg: RunConfig, context: Context, party: SecondaryParty) -> None:
    """This process's threads for the party's model (app/threads.py), applied at each training
    message (a simulation's actor may take another node's message; a no-op once set). In a
    simulation the federation's SuperNodes and the ServerApp share the machine's CPUs. The run
    config's ``threads`` comes from the primary: at most the CPUs this process may use."""
    partitions = int(context.node_config.get("num-partitions", 0))
    processes = partitions + 1 if partitions and "party" not in context.node_config else 1
    cpu = cfg.torch_device().type == "cpu"
    asked = threads.secondary_asked(cfg.runtime.threads)
    threads.use(threads.decide(asked, processes, [party.model]), "[secondary]", cpu)


def _hello(content: RecordDict, context: Context) -> RecordDict:
    """The primary names its linkage job; the party reads its own copy of it (app/node.py)."""
    cfg = node_run_config(context)
    name = handshake.party_name(cfg, context)
    job_id = messages.read_named(content, "hello", "query.hello", names=("job_id",))["job_id"]
    folder = node.linkage_dir(cfg, context, job_id)
    party = SecondaryParty(cfg, name, str(folder), str(context.node_config.get("cache-dir", "")))
    if party.job_id != job_id:
        raise MisalignedStep(
            f"party {name!r} holds linkage job {party.job_id!r} (in {folder}), but the primary's "
            f"run uses {job_id!r}; fetch that job's result into this party's linkage folder"
        )
    party_threads(cfg, context, party)
    party.persist(context)
    return RecordDict({"hello": ConfigRecord({"party": name, "rows": int(party.x.shape[0])})})


class _NodeFolders:
    """A step's keep and save, into this node's own folders for the run (app/node.py)."""

    def __init__(self, cfg, context: Context) -> None:
        self.cfg, self.context = cfg, context

    def keep(self, party: SecondaryParty, run: str, epoch: int, attempts: dict[str, str]) -> None:
        party.keep(node.model_dir(self.cfg, self.context, run, party.party), epoch, self.cfg, attempts)

    def save(self, party: SecondaryParty, run: str, epoch: int) -> str:
        return party.save_checkpoint(node.checkpoint_dir(self.cfg, self.context, run, party.party), epoch)


def _step(content: RecordDict, context: Context) -> RecordDict:
    return messages.reply_content(_step_party(messages.read_step(content), context))


def _step_packed(codec: tuple[dict, dict], context: Context) -> tuple[dict, dict]:
    """:func:`_step` over a direct link: the request and reply in their core codec."""
    return _step_party(StepRequest.decode(*codec), context).encode()


def _step_party(req: StepRequest, context: Context) -> StepReply:
    cfg = node_run_config(context)
    party = SecondaryParty.restore(cfg, context)
    party_threads(cfg, context, party)
    applied = party.applied
    try:
        reply = party.step(req, _NodeFolders(cfg, context))
    except BaseException:  # the step failed after its blocks were applied: no party keeps them
        if party.applied != applied and getattr(context, "live_party", None) is not None:
            context.live_party = None  # a direct-transport worker's, in memory: refuses further steps until restored
        raise
    party.persist(context)
    return reply


def _keep(content: RecordDict, context: Context) -> RecordDict:
    """The epoch just evaluated is the best so far: keep this state (the evaluation's) as the
    party's model for the run, in its own folder (app/node.py:model_dir). ``applied`` must match:
    the primary keeps what this party's evaluation embedded with, no later step."""
    cfg = node_run_config(context)
    rec = messages.read_named(
        content, "keep", "query.keep", names=("run", "attempt"), ints=("epoch", "applied"), optional=("previous",)
    )
    party = SecondaryParty.restore(cfg, context)
    if party.applied != rec["applied"]:
        raise MisalignedStep(
            f"party {party.party!r}: asked to keep epoch {rec['epoch']} after {rec['applied']} "
            f"gradient blocks, but it has applied {party.applied}"
        )
    attempts = {k: rec[k] for k in ATTEMPT_KEYS}
    party.keep(node.model_dir(cfg, context, rec["run"], party.party), rec["epoch"], cfg, attempts)
    return RecordDict()


def embed_kept(msg: Message, context: Context) -> Message:
    """Predict: the tokens' embeddings from this party's kept model of the run, resolved with
    the token -> row map of the run's linkage job in its own linkage folder."""
    cfg = node_run_config(context)
    name = handshake.party_name(cfg, context)
    kept, tokens = messages.read_kept_embed(msg.content)
    party = SecondaryParty.from_kept(
        node.model_dir(cfg, context, kept["run"], name) / party_kept_file(kept["attempt"]),
        name,
        str(node.linkage_dir(cfg, context, kept["job_id"])),
        lambda kept: node.with_node_paths(kept, context),
        str(context.node_config.get("cache-dir", "")),
    )
    return Message(messages.reply_content(messages.StepReply(party.embed(tokens))), reply_to=msg)


def _finish(content: RecordDict, context: Context) -> RecordDict:
    """The final model into the party's own folder for the run (app/node.py:model_dir); with
    ``exchange-report``, what the primary's feature inversion achieves against this party, which
    it measures on its own data (one ratio and its parts: no feature leaves)."""
    cfg = node_run_config(context)
    got = messages.read_named(content, "finish", "query.finish", names=("run",), optional=ATTEMPT_KEYS)
    party = SecondaryParty.restore(cfg, context)
    folder = node.model_dir(cfg, context, got["run"], party.party)
    party.save(folder, got["attempt"])
    drop_other_attempts(folder, {k: got[k] for k in ATTEMPT_KEYS})  # the run's other kept states go
    if not cfg.exchange.exchange_report:
        return RecordDict()
    from app.vfl.exchange import inversion  # lazy: scikit-learn and scipy, at the run's end only

    seed = party_seed(cfg.train.seed, f"inversion-{party.party}")
    return RecordDict({"exposure": ConfigRecord(inversion(party, seed))})  # measured on its own data


def _restore(content: RecordDict, context: Context) -> RecordDict:
    cfg = node_run_config(context)
    rec = messages.read_named(content, "state", "query.restore", names=("run",), ints=("epoch",))
    party = SecondaryParty.restore(cfg, context)
    digest = party.load_checkpoint(node.checkpoint_dir(cfg, context, rec["run"], party.party), rec["epoch"])
    party.persist(context)
    return RecordDict({"state": ConfigRecord({"digest": digest, "applied": party.applied})})


hello, step, keep, finish, restore = map(messages.flower, (_hello, _step, _keep, _finish, _restore))

# what the party worker answers over the direct link: the same handlers, its own context
DIRECT = {
    "query.hello": records(_hello),
    "train.step": packed(_step_packed, "train.step"),  # every step: without Flower's records
    "query.keep": records(_keep),
    "query.finish": records(_finish),
    "query.restore": records(_restore),
    "query.ping": records(handshake.pong),
}
