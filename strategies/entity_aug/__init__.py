"""Entity Augmentation's Flower-free core, the same rooms as strategies/vfl/: model (the parties'
models, the primary, the training protocol), channel (contract + in-process), exchange
(Algorithm 1's queue and timeout fallback)."""
