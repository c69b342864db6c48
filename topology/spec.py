"""The topology file (DESIGN 3.1) as typed values, validated at the edge."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from weave_rl.topology.catalog import GpuType


class ClusterSpec(BaseModel):
    """A pool of identical nodes behind one fabric switch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.]+$")
    gpu_type: str
    nodes: int = Field(gt=0, le=9999)
    gpus_per_node: int = Field(default=8, gt=0)
    host_mem_gb: float = Field(default=2048, gt=0)
    pcie_gbps: float = Field(default=256, gt=0, description="host<->GPU, per GPU")
    nvlink_gbps: float = Field(default=3600, gt=0, description="GPU<->GPU inside a node")
    fabric_gbps: float = Field(default=400, gt=0, description="per node into the cluster fabric")


class LinkSpec(BaseModel):
    """A link between two clusters' fabric switches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    between: tuple[str, str]
    gbps: float = Field(gt=0)
    latency_ms: float = Field(default=0.0, ge=0)

    @field_validator("between")
    @classmethod
    def _distinct(cls, value: tuple[str, str]) -> tuple[str, str]:
        if value[0] == value[1]:
            raise ValueError("a link must join two different clusters")
        return value


class TopologySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    gpu_types: dict[str, GpuType] = Field(default_factory=dict)
    clusters: list[ClusterSpec] = Field(min_length=1)
    links: list[LinkSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> "TopologySpec":
        seen: set[str] = set()
        for cluster in self.clusters:
            if cluster.name in seen:
                raise ValueError(f"duplicate cluster name {cluster.name!r}")
            seen.add(cluster.name)
        return self
