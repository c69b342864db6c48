"""Planner: problem -> solver model -> decoded Plan; baselines; validator."""
