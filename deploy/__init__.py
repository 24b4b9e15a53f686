"""Operator tooling, outside the Flower app: a TLS + node-auth deployment on one machine
(``python -m deploy up|link|run|down``), its certificates, and the local SuperLink that tests
and benchmarks run `flwr run` simulations on."""
