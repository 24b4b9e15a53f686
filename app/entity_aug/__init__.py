"""Entity Augmentation as Flower glue (run-config ``mode = "entity-aug"``), the same rooms as app/vfl/.

- server.py     the ServerApp's run (the host: labels, queue, timeout fallback, records)
- client.py     the ClientApp's handlers of a guest (one per protocol step)
- channel.py    the host's channel to the guests (over app/transport.py)
- parties.py    the parties built from a RunConfig, and their messages
- inprocess.py  the same run with every party in one process (sweeps)
"""
