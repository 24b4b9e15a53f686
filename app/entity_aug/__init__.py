"""Entity Augmentation as Flower glue (run-config ``mode = "entity-aug"``), the same rooms as app/vfl/.

- server.py     the ServerApp's run (the host: labels, queue, timeout fallback, records)
- client.py     the ClientApp's handlers of a guest (one per protocol step)
- channel.py    the host's channel to the guests (over app/transport.py)
- parties.py    the parties built from a RunConfig, and their messages
- inprocess.py  the same run with every party in one process (sweeps)
- kept.py       the best epoch's states (the host's run folder; over Flower each guest's own)
- predict.py    predict for entities by id, every party in process
- predict_server.py  predict over Flower (the host's side; the guests' in client.py)
"""
