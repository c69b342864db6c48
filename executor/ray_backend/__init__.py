"""The ``ray`` backend: the local backend's workers as Ray actors (DESIGN section 5).

Modules: ``cluster`` (connecting to Ray: ``--address``; one placement group per topology node;
explicit device indices per Ray node), ``actor`` (``RayWorker``: the local worker's phase shim in a
Ray actor), ``transport`` (``RayTransport``: how the worker backend starts, reaches and loses its
workers when they are actors), ``backend`` (``RayBackend``: the worker backend of
``weave_rl.executor.local.backend``, with its bookkeeping and fault handling, over a ``RayTransport``),
``run`` (``run_plan_ray``, the library call behind ``weave run --backend ray``).

Notes:

- Transport choice: weights (sync) and gradients (data-parallel all-reduce) go over torch.distributed
  gloo between the actors, exactly as between local workers (``weave_rl.executor.local.comm``; NCCL for train
  groups on CUDA), not through Ray's object store: one tested code path for both backends, the
  trainer sends straight to the rollout actors (no copy into and out of plasma, no driver hop), and
  a sync lands in a rollout actor's host cache while it computes another job's phase. The
  rendezvous store is a FileStore in the run folder (no listener). Control messages and results are Ray actor calls.
- Multi-node needs: the run folder (``--out``: rollout shards, checkpoints) on a filesystem every
  node mounts at the same path (each actor checks a token file at start and fails clearly
  otherwise); weave installed in the same Python environment on every node; gloo reachable between
  nodes (``GLOO_SOCKET_IFNAME`` when the default interface is wrong). Clock offsets between the
  driver's node and the others are measured at start and applied to every reported time.
- ``run_plan_ray`` runs ``run_plan_local``'s loop with ``RayBackend`` as its ``backend_factory``.

Only ``actor``, ``transport``, ``backend`` and ``run`` import ray; the CLI imports them for ``--backend ray`` only.
"""
