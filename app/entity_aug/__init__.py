"""Entity Augmentation as Flower glue (run-config ``mode = "entity-aug"``), the same rooms as app/vfl/.

Primary and secondaries are the EA paper's host and guests.

- server.py     the ServerApp's run (the primary: labels, queue, timeout fallback, records)
- client.py     the ClientApp's handlers of a secondary (one per protocol step)
- channel.py    the primary's channel to the secondaries (FlowerChannel, over app/transport.py)
- parties.py    the parties built from a RunConfig, and their messages
- inprocess.py  the same run with every party in one process (sweeps)
- kept.py       the best epoch's states (the primary's run folder; over Flower each secondary's own)
- predict.py    predict for entities by id, every party in process
- predict_server.py  predict over Flower (the primary's side; the secondaries' in client.py)
"""
