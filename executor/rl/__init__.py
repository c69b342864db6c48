"""The built-in real RL job: GRPO on verifiable synthetic tasks or the user's prompts, behind the phase shim.

Importing this package registers workload kind ``grpo`` (``weave_rl.executor.workload.build_workload``).
Modules: ``options`` (the workload block), ``checks`` (the block checked in the controller: model
directory, dataset, reward), ``tokenizer``, ``tasks`` (problems and rule-based scores), ``data``
(JSONL / parquet prompt datasets, per-epoch seeded order), ``rewards`` (built-in rules, imported
functions, loud failures), ``model`` (tiny seeded Llama, SmolLM2-135M or a local Hugging Face
directory), ``sampling`` (KV-cache decoding, log-probs), ``loss`` (advantages, clipped loss),
``samples`` (sharding, ids, seeds), ``grpo`` (the Workload).
"""

from weave_rl.executor.rl.grpo import GRPOWorkload
from weave_rl.executor.rl.options import GRPOOptions
from weave_rl.executor.rl.samples import concat_samples

__all__ = ["GRPOOptions", "GRPOWorkload", "concat_samples"]
