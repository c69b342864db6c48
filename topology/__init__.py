"""Cluster topology: GPU catalog, typed model, networkx graph, presets and the sync-time model."""
