"""The primary party's side of FedSim: its model (local MLP, aggregation MLP, gates),
the task head, and the training protocol that drives secondaries through a channel."""
