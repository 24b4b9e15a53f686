"""FedSim's Flower-free core: the primary's model (local MLP, gates, aggregation), the strategy
that turns a batch into cut-layer gradients, the training protocol over a channel, and the
one-process twin that the federated runs are proven equal to."""
