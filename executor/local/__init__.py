"""The ``local`` backend: one worker process per logical GPU of a plan, on this machine's devices.

Modules: ``devices`` (--map), ``messages`` (what crosses the pipes), ``worker`` (the process main
loop and the phase shim), ``comm`` (torch.distributed groups, weight packing), ``samples`` (rollout
shards on disk), ``backend`` (``WorkerBackend`` / ``LocalBackend``, the Backend protocol over workers,
elastic prompt groups included), ``transport`` (how the backend reaches its workers: the ``Transport``
protocol and ``ProcessTransport``; ``weave_rl.executor.ray_backend.transport`` is the Ray one),
``journal`` (what ``--resume`` reads), ``run`` (``run_plan_local``, the library call behind ``weave
run``), ``toy`` (a tiny policy-gradient bandit Workload for tests and benchmarks), ``longtail`` (a job
whose responses have heavy-tailed lengths, for long-tail migration).
"""
