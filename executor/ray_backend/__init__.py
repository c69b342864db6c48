"""The ``ray`` backend: the local backend's workers as Ray actors (DESIGN section 5).

Modules: ``cluster`` (connecting to Ray: ``--address``; one placement group per topology node;
explicit device indices per Ray node), ``actor`` (``RayWorker``: the local worker's phase shim in a
Ray actor), ``backend`` (``RayBackend``, the Backend protocol: the local backend's bookkeeping and
fault handling over actor calls), ``run`` (``run_plan_ray``, the library call behind
``weave run --backend ray``).

Nothing here imports ray at package import time except ``actor``, ``backend`` and ``run``; the CLI
imports them only for ``--backend ray``.
"""
