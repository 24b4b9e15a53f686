"""ClientApp of a secondary party: one handler per protocol step."""

from __future__ import annotations

from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from app import messages
from app.config import RunConfig
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
    cfg = RunConfig.from_flower(context.run_config)
    name = party_name(cfg, context)
    # a deployed party may keep its own copy of its linkage result (node config "linkage-dir")
    job_dir = str(context.node_config.get("linkage-dir", msg.content.config_records["hello"]["job_dir"]))
    party = SecondaryParty(cfg, name, job_dir)
    party.persist(context)
    reply = ConfigRecord({"party": name, "rows": int(party.x.shape[0])})
    return Message(RecordDict({"hello": reply}), reply_to=msg)


@app.train("step")
def step(msg: Message, context: Context) -> Message:
    party = SecondaryParty.restore(RunConfig.from_flower(context.run_config), context)
    blocks, tokens = messages.read_step(msg.content)
    party.apply(blocks)
    emb = party.embed(tokens)
    party.persist(context)
    return Message(messages.embeddings_content(emb), reply_to=msg)


@app.query("embed")
def embed(msg: Message, context: Context) -> Message:
    party = SecondaryParty.restore(RunConfig.from_flower(context.run_config), context)
    return Message(messages.embeddings_content(party.embed(messages.read_tokens(msg.content))), reply_to=msg)


@app.query("finish")
def finish(msg: Message, context: Context) -> Message:
    party = SecondaryParty.restore(RunConfig.from_flower(context.run_config), context)
    party.save(Path(str(msg.content.config_records["finish"]["folder"])) / party.party)
    return Message(RecordDict(), reply_to=msg)


@app.query("ping")
def ping(msg: Message, context: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)
