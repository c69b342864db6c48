"""The topology file (DESIGN 3.1) as typed values, validated at the edge."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from weave_rl.topology.catalog import GpuType

# Numbers in a topology file: no bools (``nodes: true`` is not 1 node), finite, and bounded so that
# no product of them overflows (a bandwidth of 1e7 Gbit/s is far past any real link).
_CONFIG = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
_BIG = 1e12  # "effectively unbounded" in tests (1e9) still passes; products stay finite
MAX_TOTAL_NODES = 100_000


class GpuTypeSpec(GpuType):
    """A GPU type given in a topology file (``gpu_types:``): the catalog's fields, checked strictly."""

    model_config = _CONFIG

    tflops_bf16: Annotated[float, Field(gt=0, le=1e6, strict=True, description="dense bf16 TFLOPS")]
    hbm_gb: Annotated[float, Field(gt=0, le=1e6, strict=True)]
    hbm_tbps: Annotated[float, Field(gt=0, le=1e6, strict=True, description="HBM bandwidth, TB/s")]
    usd_per_hour: Annotated[float, Field(ge=0, le=1e6, strict=True)]


class ClusterSpec(BaseModel):
    """A pool of identical nodes behind one fabric switch."""

    model_config = _CONFIG

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.]+$", strict=True)
    gpu_type: str = Field(min_length=1, strict=True)
    nodes: int = Field(gt=0, le=9999, strict=True)
    gpus_per_node: int = Field(default=8, gt=0, le=1024, strict=True)
    host_mem_gb: float = Field(default=2048, gt=0, le=_BIG, strict=True)
    pcie_gbps: float = Field(default=256, gt=0, le=_BIG, strict=True, description="host<->GPU, per GPU")
    nvlink_gbps: float = Field(default=3600, gt=0, le=_BIG, strict=True, description="GPU<->GPU inside a node")
    fabric_gbps: float = Field(default=400, gt=0, le=_BIG, strict=True,
                               description="per node into the cluster fabric")


class LinkSpec(BaseModel):
    """A link between two clusters' fabric switches."""

    model_config = _CONFIG

    between: tuple[Annotated[str, Field(strict=True)], Annotated[str, Field(strict=True)]]
    gbps: float = Field(gt=0, le=_BIG, strict=True)
    latency_ms: float = Field(default=0.0, ge=0, le=1e6, strict=True)

    @field_validator("between")
    @classmethod
    def _distinct(cls, value: tuple[str, str]) -> tuple[str, str]:
        if value[0] == value[1]:
            raise ValueError("a link must join two different clusters")
        return value


class TopologySpec(BaseModel):
    model_config = _CONFIG

    name: str = Field(min_length=1, strict=True)
    gpu_types: dict[Annotated[str, Field(min_length=1, strict=True)], GpuTypeSpec] = Field(default_factory=dict)
    clusters: list[ClusterSpec] = Field(min_length=1)
    links: list[LinkSpec] = Field(default_factory=list)
    # Repeated cluster names are reported by the loader (topology_from_data / Topology), each at its key.

    @model_validator(mode="after")
    def _not_too_large(self) -> "TopologySpec":
        nodes = sum(c.nodes for c in self.clusters)
        if nodes > MAX_TOTAL_NODES:
            raise ValueError(f"{nodes:,} nodes in all; at most {MAX_TOTAL_NODES:,}")
        return self
