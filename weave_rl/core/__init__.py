"""Basics every layer uses: ``errors`` (the one user-mistake error) and ``yamlio`` (YAML files with
errors that name the file and the line). Imports nothing of the project."""
