"""Entity Augmentation's Flower-free core: the parties' models, Algorithm 1's exchange (queue,
timeout fallback) and the training protocol."""
