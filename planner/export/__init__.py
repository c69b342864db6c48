"""Export a plan as other systems' settings: ``weave plan export PLAN --to verl|roll|k8s|ray -o DIR``.

One module per target (its format is in the module's docstring); ``layout`` extracts each job's
GPUs and defines the global GPU rank order. Files written:

- ``verl``: ``DIR/<job>.verl.yaml`` per job (resource pools, hybrid engine or separate rollout pool);
- ``roll``: ``DIR/<job>.roll.yaml`` per job (``device_mapping`` in global ranks);
- ``k8s``:  ``DIR/<group>.k8s.yaml`` per group (one Deployment per pool, schema-checked);
- ``ray``:  ``DIR/<job>.ray.json`` per job (placement-group bundles pinned to nodes and GPUs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from weave_rl.planner.export import k8s, ray, roll, verl
from weave_rl.planner.export.layout import job_layouts
from weave_rl.planner.plan import Plan
from weave_rl.topology.topology import Topology
from weave_rl.core.errors import InputError
EXPORTERS = ("verl", "roll", "k8s", "ray")


class _NoAliases(yaml.SafeDumper):
    """Repeated dicts (a Deployment's labels and its template's) are written out, not as &id001 aliases."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _yaml(docs: list) -> str:
    return yaml.dump_all(docs, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=110)


@dataclass(frozen=True)
class ExportOptions:
    plan_name: str = "plan"
    image: str = "weave-executor:latest"
    namespace: str | None = None
    source: str = "<plan>"  # the plan file, for error messages


@dataclass
class ExportResult:
    files: list[Path] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def export_data(plan: Plan, topo: Topology, target: str, options: ExportOptions = ExportOptions(),
                warnings: list[str] | None = None) -> dict[str, object]:
    """{file name: content} without writing: dicts for YAML/JSON, a list of manifests for k8s."""
    warnings = [] if warnings is None else warnings
    layouts = job_layouts(plan, topo, options.plan_name, options.source)
    if target == "verl":
        return {f"{lay.job}.verl.yaml": verl.build(lay, topo, options.source, warnings) for lay in layouts}
    if target == "roll":
        return {f"{lay.job}.roll.yaml": roll.build(lay, topo, options.source, warnings) for lay in layouts}
    if target == "ray":
        return {f"{lay.job}.ray.json": ray.build(lay, topo, [o for o in layouts if o.group == lay.group])
                for lay in layouts}
    if target == "k8s":
        docs = k8s.build(plan, topo, layouts, options.plan_name, options.image, options.namespace)
        return {f"{group}.k8s.yaml": manifests for group, manifests in docs.items()}
    raise InputError("<command line>", "--to", f"unknown target {target!r} (targets: {', '.join(EXPORTERS)})")


def export_plan(plan: Plan, topo: Topology, target: str, out: Path,
                options: ExportOptions = ExportOptions()) -> ExportResult:
    result = ExportResult()
    data = export_data(plan, topo, target, options, result.warnings)
    if not data:
        result.warnings.append("the plan places no job: nothing to export")
    if out.exists() and not out.is_dir():
        raise InputError(str(out), None, "exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    header = f"# weave plan export --to {target}: plan {options.plan_name} on topology {topo.name}\n"
    explain = {"verl": verl.header, "roll": roll.header}.get(target)
    for name, content in data.items():
        path = out / name
        if name.endswith(".json"):
            path.write_text(json.dumps(content, indent=2) + "\n")
        else:
            lines = "".join(f"# {line}\n" if line else "#\n" for line in explain(content)) if explain else ""
            path.write_text(header + lines + _yaml(content if isinstance(content, list) else [content]))
        result.files.append(path)
    return result
