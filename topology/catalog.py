"""Built-in GPU catalog: dense bf16 TFLOPS, HBM capacity and bandwidth, and $/h per GPU.

Sources:
- H20 and H800: the Weave paper, Table 1 (148 / 989.5 TFLOPS, 96 / 80 GB, 4.0 / 3.35 TB/s,
  $1.85 / $5.28 per hour).
- Hardware figures for H100 (SXM), H200 (SXM), A100 (80 GB SXM), A800 (80 GB SXM) and L40S: NVIDIA
  data sheets, dense (no sparsity) bf16 tensor-core TFLOPS.
- Prices for those five: rounded 2025 on-demand per-GPU list prices of public GPU clouds
  (Lambda, RunPod); A800 is the export variant of the A100 and is priced like it. They are there so
  that plans on these types have a cost; override them in a topology file (``gpu_types:``) with your
  own contract prices.
- CPU: the logical devices of the ``local`` preset (one per core on a machine without a GPU); its
  figures are nominal, only their ratios to each other matter for the local executor.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GpuType(BaseModel):
    """One accelerator type."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tflops_bf16: float = Field(gt=0, description="dense bf16 TFLOPS")
    hbm_gb: float = Field(gt=0)
    hbm_tbps: float = Field(gt=0, description="HBM bandwidth, TB/s")
    usd_per_hour: float = Field(ge=0)


BUILTIN_GPU_TYPES: dict[str, GpuType] = {
    "H20": GpuType(tflops_bf16=148.0, hbm_gb=96, hbm_tbps=4.0, usd_per_hour=1.85),
    "H800": GpuType(tflops_bf16=989.5, hbm_gb=80, hbm_tbps=3.35, usd_per_hour=5.28),
    "H100": GpuType(tflops_bf16=989.5, hbm_gb=80, hbm_tbps=3.35, usd_per_hour=2.99),
    "H200": GpuType(tflops_bf16=989.5, hbm_gb=141, hbm_tbps=4.8, usd_per_hour=3.79),
    "A100": GpuType(tflops_bf16=312.0, hbm_gb=80, hbm_tbps=2.039, usd_per_hour=1.79),
    "A800": GpuType(tflops_bf16=312.0, hbm_gb=80, hbm_tbps=2.039, usd_per_hour=1.79),
    "L40S": GpuType(tflops_bf16=362.05, hbm_gb=48, hbm_tbps=0.864, usd_per_hour=0.86),
    "CPU": GpuType(tflops_bf16=1.0, hbm_gb=4, hbm_tbps=0.05, usd_per_hour=0.05),
}
