"""The messages a FedSim secondary answers without its model: the direct transport's
``query.direct_open`` (start the party worker), predict's ``query.predict_hello`` and
``query.ping``. A deployed SuperNode runs every message in a fresh ClientApp process (Flower
1.42), so these import neither torch nor the data stack (~1.2 s and ~1 s of CPU a process):
app/client_app.py loads the model's handlers (app/vfl/client.py) at their first message only."""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from app import messages
from app import party_worker as worker
from app.config import RunConfig
from app.node import node_run_config


def party_name(cfg: RunConfig, context: Context) -> str:
    """Deployment: --node-config 'party="..."'; simulation: the partition-id-th secondary."""
    if "party" in context.node_config:
        return str(context.node_config["party"])
    from app.vfl.parties import simulation_party  # lazy: the run's data, a simulation's only (long-lived actors)

    return simulation_party(cfg, int(context.node_config["partition-id"]))


def direct_open(msg: Message, context: Context) -> Message:
    """The direct transport's handshake: start this node's party worker with the run key the
    primary drew for it (app/party_worker.py); the reply names the party (this node's own config)
    and the address the worker listens at. The worker loads the party's data on the link's hello."""
    cfg = node_run_config(context)
    key = messages.read_named(msg.content, "direct_open", "query.direct_open", names=("key",))["key"]
    address = worker.spawn(context, key, cfg.runtime.node_timeout)
    return Message(
        RecordDict({"direct_open": ConfigRecord({"party": party_name(cfg, context), "address": address})}), reply_to=msg
    )


def predict_hello(msg: Message, context: Context) -> Message:
    """Predict's handshake: which party this node plays (its model is read per request)."""
    cfg = node_run_config(context)
    messages.read_named(msg.content, "predict_hello", "query.predict_hello", names=("job_id",))
    return Message(RecordDict({"predict_hello": ConfigRecord({"party": party_name(cfg, context)})}), reply_to=msg)


def pong(content: RecordDict, context: Context) -> RecordDict:
    """``query.ping``: the node is there (the direct transport's worker answers it too)."""
    return RecordDict()


ping = messages.flower(pong)
