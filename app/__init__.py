"""Flower apps: the primary party's ServerApp and the secondaries' ClientApp."""
