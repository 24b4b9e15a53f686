"""ClientApp of a secondary party: one handler per protocol step."""

from __future__ import annotations

from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from app import ea_guest, messages
from app.config import RunConfig
from app.node import node_run_config
from app.parties import simulation_party
from app.secondary import SecondaryParty

app = ClientApp()


def party_name(cfg: RunConfig, context: Context) -> str:
    """Deployment: --node-config 'party="..."'; simulation: the partition-id-th secondary."""
    if "party" in context.node_config:
        return str(context.node_config["party"])
    return simulation_party(cfg, int(context.node_config["partition-id"]))


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    cfg = node_run_config(context)
    name = party_name(cfg, context)
    # a deployed party may keep its own copy of its linkage result (node config "linkage-dir")
    job_dir = str(context.node_config.get("linkage-dir", msg.content.config_records["hello"]["job_dir"]))
    party = SecondaryParty(cfg, name, job_dir, str(context.node_config.get("cache-dir", "")))
    party.persist(context)
    reply = ConfigRecord({"party": name, "rows": int(party.x.shape[0])})
    return Message(RecordDict({"hello": reply}), reply_to=msg)


@app.train("step")
def step(msg: Message, context: Context) -> Message:
    party = SecondaryParty.restore(node_run_config(context), context)
    blocks, tokens, meta = messages.read_step(msg.content)
    party.check(meta, blocks, tokens)
    party.apply(blocks)
    state = None
    save = messages.read_save(msg.content)
    if save is not None:  # end of an epoch: checkpoint, then embed for the evaluation
        folder, run, epoch = save
        digest = party.save_checkpoint(state_folder(folder, run, context, party.party), epoch)
        state = {"digest": digest, "applied": party.applied, "epoch": epoch}
    emb = party.embed(tokens)
    party.persist(context)
    return Message(messages.embeddings_content(emb, state), reply_to=msg)


@app.query("finish")
def finish(msg: Message, context: Context) -> Message:
    party = SecondaryParty.restore(node_run_config(context), context)
    party.save(Path(str(msg.content.config_records["finish"]["folder"])) / party.party)
    return Message(RecordDict(), reply_to=msg)


def state_folder(folder: str, run: str, context: Context, party: str) -> Path:
    """Where this party keeps its checkpoints: its node config's "checkpoint-dir" (a deployed
    party's own disk), else the folder the primary proposes (simulation: one machine)."""
    if not run or "/" in run or "\\" in run or run in (".", ".."):
        raise ValueError(f"refusing checkpoint run name {run!r}: it must be one plain folder name")
    own = str(context.node_config.get("checkpoint-dir", ""))
    return Path(own) / run / party if own else Path(folder)


@app.query("restore")
def restore(msg: Message, context: Context) -> Message:
    party = SecondaryParty.restore(node_run_config(context), context)
    rec = msg.content.config_records["state"]
    folder = state_folder(str(rec["folder"]), str(rec["run"]), context, party.party)
    digest = party.load_checkpoint(folder, int(rec["epoch"]))
    party.persist(context)
    return Message(RecordDict({"state": ConfigRecord({"digest": digest, "applied": party.applied})}), reply_to=msg)


@app.query("ping")
def ping(msg: Message, context: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)


# Entity Augmentation (run-config mode = "entity-aug"): the guest's handlers, app/ea_guest.py
app.query("ea_hello")(ea_guest.hello)
app.train("ea_step")(ea_guest.step)
app.query("ea_embed")(ea_guest.embed)
app.query("ea_finish")(ea_guest.finish)
