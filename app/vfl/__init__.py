"""FedSim and its baselines as Flower glue (run-config ``mode = "vfl"``).

- server.py     the primary's run, one driver for both engines (data, linkage, parties, training, records)
- client.py     the ClientApp's handlers of a secondary (one per protocol step)
- secondary.py  a secondary party: its model and optimiser between messages
- channel.py    the primary's channel to the secondaries (over app/transport.py, or in process)
- direct.py     the same channel over the direct transport (each party worker's own link)
- worker.py     a secondary's party worker: the client's handlers, the party in memory
- parties.py    the parties built from a RunConfig: data, linkage job, models, strategy
- checkpoint.py every party's state after each epoch; resume
- inprocess.py  that driver with every party in one process (sweeps), and the twin oracles' runs
"""
