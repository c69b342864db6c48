"""Weave: co-scheduler for disaggregated RL post-training."""

__version__ = "0.1.0"
