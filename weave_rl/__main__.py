"""``python -m weave_rl ...`` is the ``weave`` command."""

from weave_rl.cli.app import run

run()
