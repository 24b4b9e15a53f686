"""ClientApp of a secondary party: one handler per protocol step, for both training modes
(FedSim: app/vfl/client.py; Entity Augmentation: app/entity_aug/client.py)."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from app.entity_aug import client as ea_secondary
from app.vfl import client as vfl
from files.private import private_umask


def private_files(msg: Message, context: Context, call_next) -> Message:
    """Every handler writes its party's models, checkpoints and caches 0600 in 0700 folders, whatever
    umask the SuperNode (or simulation) that runs this app was started with (files.private)."""
    private_umask()
    return call_next(msg, context)


app = ClientApp(mods=[private_files])

# FedSim and its baselines (run-config mode = "vfl")
app.query("hello")(vfl.hello)
app.train("step")(vfl.step)
app.query("finish")(vfl.finish)
app.query("restore")(vfl.restore)
app.query("ping")(vfl.ping)
app.query("direct_open")(vfl.direct_open)
app.query("keep")(vfl.keep)
app.query("predict_hello")(vfl.predict_hello)
app.query("embed_kept")(vfl.embed_kept)

# Entity Augmentation (run-config mode = "entity-aug")
app.query("ea_ids")(ea_secondary.ids)
app.query("ea_hello")(ea_secondary.hello)
app.train("ea_step")(ea_secondary.step)
app.query("ea_embed")(ea_secondary.embed)
app.query("ea_finish")(ea_secondary.finish)
app.query("ea_keep")(ea_secondary.keep)
app.query("ea_predict_hello")(ea_secondary.predict_hello)
app.query("ea_embed_kept")(ea_secondary.embed_kept)
app.query("ea_direct_open")(ea_secondary.direct_open)
