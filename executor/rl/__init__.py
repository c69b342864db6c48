"""The built-in real RL job: GRPO on verifiable synthetic tasks, behind the phase shim.

Importing this package registers workload kind ``grpo`` (``weave_rl.executor.workload.build_workload``).
Modules: ``options`` (the workload block), ``tokenizer``, ``tasks`` (problems and rule-based
scores), ``model`` (tiny seeded Llama or SmolLM2-135M), ``sampling`` (KV-cache decoding, log-probs),
``loss`` (advantages, clipped loss), ``samples`` (sharding, ids, seeds), ``grpo`` (the Workload).
"""

from weave_rl.executor.rl.grpo import GRPOWorkload
from weave_rl.executor.rl.options import GRPOOptions
from weave_rl.executor.rl.samples import concat_samples

__all__ = ["GRPOOptions", "GRPOWorkload", "concat_samples"]
