"""The messages an Entity Augmentation secondary answers without its model: the direct
transport's ``query.ea_direct_open`` (start the party worker) and predict's
``query.ea_predict_hello``. Each deployed message is a fresh ClientApp process (Flower 1.42):
these import neither torch nor the data stack; app/client_app.py loads the model's handlers
(app/entity_aug/client.py) at their first message only."""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from app import messages, party_worker
from app.config import RunConfig
from app.node import node_run_config


def secondary_name(cfg: RunConfig, context: Context) -> str:
    """Deployment: --node-config 'party="..."'; simulation: the partition-id-th secondary."""
    if "party" in context.node_config:
        return str(context.node_config["party"])
    from app.entity_aug import id_exchange  # lazy: the parties' model and data, a simulation's only
    from app.entity_aug.parties import simulation_secondary  # lazy: as id_exchange

    names = id_exchange.exchanged_secondaries(cfg)  # parties.toml (read once), not the others' files
    return simulation_secondary(cfg, int(context.node_config["partition-id"]), names)


def direct_open(msg: Message, context: Context) -> Message:
    """The direct transport's handshake: start this node's party worker (app/party_worker.py)
    with the run key the primary drew for it; the reply names the party (this node's own config)
    and the address the worker listens at. The worker builds the party on the link's hello."""
    cfg = node_run_config(context)
    key = messages.read_named(msg.content, "ea_direct_open", "query.ea_direct_open", names=("key",))["key"]
    address = party_worker.spawn(context, key, cfg.runtime.node_timeout, "app.entity_aug.client")
    reply = ConfigRecord({"party": secondary_name(cfg, context), "address": address})
    return Message(RecordDict({"ea_direct_open": reply}), reply_to=msg)


def predict_hello(msg: Message, context: Context) -> Message:
    """Predict's handshake: which secondary this node plays (its kept state is read per request)."""
    cfg = node_run_config(context)
    messages.expect_fields(msg.content.config_records["ea_predict_hello"], set(), "query.ea_predict_hello")
    return Message(
        RecordDict({"ea_predict_hello": ConfigRecord({"party": secondary_name(cfg, context)})}), reply_to=msg
    )
