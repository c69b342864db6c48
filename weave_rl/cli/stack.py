"""``weave profile import`` (framework logs -> measured records) and ``weave plan export`` (a plan ->
veRL / ROLL / Kubernetes / Ray settings).

Thin on purpose: parse, call ``weave_rl.profiles.importers`` or ``weave_rl.planner.export``, render. Registered on the
``profile`` and ``plan`` sub-apps by one line in ``weave_rl/cli/app.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from weave_rl.core.errors import InputError
from weave_rl.cli.render import console, err_console, print_json

IMPORT_HELP = (
    "Import phase timings from a veRL, ROLL or OpenRLHF log into records (DESIGN 3.4).\n\n"
    "LOG is a console log, JSON lines, or a tracking export (.csv, one row per step).\n\n"
    "GPU counts come from the run's config: --config FILE, else LOG's name with .yaml/.yml/.json, else "
    "config.yaml or .hydra/config.yaml beside LOG, else what LOG prints itself (veRL: the resolved config main_ppo "
    "prints at start, else the command line's trainer.nnodes=... trainer.n_gpus_per_node=... overrides). Keys read: veRL trainer.nnodes x trainer.n_gpus_per_node "
    "(train) and rollout.nnodes x rollout.n_gpus_per_node (a separate rollout pool; without one, rollout shares "
    "the training GPUs); ROLL len(actor_train.device_mapping) and len(actor_infer.device_mapping); OpenRLHF "
    "actor.num_nodes x actor.num_gpus_per_node and vllm.num_engines x vllm.tensor_parallel_size. "
    "--train-gpus / --rollout-gpus override them.\n\n"
    "Phases: veRL rollout = timing_s/gen, train = reward + old_log_prob + ref + values + adv + update_critic + "
    "update_actor, sync = update_weights (or the same under timing/, veRL's earlier names); ROLL rollout = time/step_generate, train = ref_log_probs_values + "
    "old_log_probs + get_sample_level_mask + compute_advantage + reward_postprocess + get_token_reward (also per "
    "domain, <domain>/time/...) + step_train, sync = step_model_update, switch = onload + offload (0, with a warning, "
    "when the log has none); OpenRLHF (console 'Global step N: {...}' lines, JSON lines or CSV) rollout = "
    "timing/generation, train = make_experience + ppo_train, sync = broadcast; the async trainer's steps are laid "
    "out overlapped (step_total is wall time there).\n\n"
    "Lines that carry no usable step are counted and reported with their line numbers (as grep -n counts them: "
    "a tqdm carriage return is not a line break; ANSI colour is ignored); a log with no usable "
    "step is an error (exit 2)."
)


def register(profile_app: typer.Typer, plan_app: typer.Typer) -> None:
    profile_app.command("import", help=IMPORT_HELP)(profile_import)
    plan_app.command("export")(plan_export)


def profile_import(
    log: Path = typer.Argument(..., metavar="LOG", help="Training log: console, JSON lines or .csv export."),
    framework: str = typer.Option(..., "--from", help="verl | roll | openrlhf"),
    out: Path = typer.Option(..., "-o", "--out", help="Records to write (.parquet or .csv)."),
    job: Optional[str] = typer.Option(None, "--job", help="Job name in the records (default: the run's name "
                                      "in the config, else LOG's stem)."),
    gpu_type: Optional[str] = typer.Option(None, "--gpu-type", help="GPU model, e.g. H800, or rollout=H20,train=H800 "
                                           "(logs do not record it; required)."),
    config: Optional[Path] = typer.Option(None, "--config", help="The run's config (YAML/JSON) with its GPU counts."),
    train_gpus: Optional[int] = typer.Option(None, "--train-gpus", min=1, help="Training GPUs (overrides the config)."),
    rollout_gpus: Optional[int] = typer.Option(None, "--rollout-gpus", min=1,
                                               help="Rollout GPUs (overrides the config; default: the training GPUs)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
) -> None:
    from weave_rl.profiles.importers import ImportOptions, import_framework_log
    from weave_rl.profiles.records import write_records

    if out.suffix.lower() not in (".csv", ".parquet", ".pq"):
        raise InputError(str(out), None, "unsupported records format: use .csv or .parquet")
    options = ImportOptions(job=job, gpu_type=gpu_type, config=config, train_gpus=train_gpus,
                            rollout_gpus=rollout_gpus)
    result = import_framework_log(framework, log, options)
    write_records(result.records, out)
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {log}: {warning}", highlight=False, soft_wrap=True)
    frame, p = result.records, result.placement
    counts = {ph: int((frame["phase"] == ph).sum()) for ph in ("rollout", "train", "sync")}
    summary = {"job": result.job, "log": str(log), "format": result.log_format, "config": result.config_file,
               "steps": int(frame["iteration"].nunique()), "rows": counts, "out": str(out),
               "rollout": {"gpus": p.rollout_gpus, "gpu_type": p.rollout_gpu_type},
               "train": {"gpus": p.train_gpus, "gpu_type": p.train_gpu_type}, "warnings": result.warnings}
    if as_json:
        print_json(summary)
        return
    console.print(f"imported {summary['steps']} steps of job {result.job} from {log} ({result.log_format}): "
                  f"rollout {p.rollout_gpus} x {p.rollout_gpu_type}, train {p.train_gpus} x {p.train_gpu_type}; "
                  f"{counts['rollout']} rollout, {counts['train']} train, {counts['sync']} sync rows"
                  f"{'; GPU counts from ' + result.config_file if result.config_file else ''}; wrote {out}",
                  highlight=False, soft_wrap=True)


def plan_export(
    plan_file: Path = typer.Argument(..., metavar="PLAN"),
    target: str = typer.Option(..., "--to", help="verl | roll | k8s | ray"),
    out: Path = typer.Option(..., "-o", "--out", help="Folder for the exported files."),
    topology: Optional[str] = typer.Option(None, "--topology", "-t", help="Topology file or preset (default: the "
                                           "plan's topology_source, else its topology when a preset)."),
    image: str = typer.Option("weave-executor:latest", "--image", help="k8s: container image of the workers."),
    namespace: Optional[str] = typer.Option(None, "--namespace", help="k8s: namespace of the manifests."),
) -> None:
    """Export a plan as framework settings: veRL resource pools, ROLL device_mapping, k8s manifests, Ray bundles.

    Files: verl DIR/<job>.verl.yaml (trainer/rollout nnodes x n_gpus_per_node, hybrid engine or a separate rollout
    pool, resource_pool_spec under weave_placement); roll DIR/<job>.roll.yaml (device_mapping of actor_train,
    actor_infer, reference in global GPU ranks: nodes in topology order x GPU index); k8s DIR/<group>.k8s.yaml (one
    Deployment per pool, pinned to the group's nodes, whole-node nvidia.com/gpu requests); ray DIR/<job>.ray.json
    (placement groups, one bundle per node, with node and GPU ids).

    The veRL and ROLL files start with a comment: the keys the framework reads, the weave_placement block that is
    for the operator (drop it before Hydra reads the file), and for ROLL which ranks land on which node (ROLL
    reserves whole nodes: a job holding part of one is warned about). Without --topology the plan's recorded
    topology_source (written by weave plan -o) is used, else its topology name when that is a preset.
    """
    from weave_rl.planner.export import EXPORTERS, ExportOptions, export_plan
    from weave_rl.planner.plan import load_plan, plan_topology_ref
    from weave_rl.topology.topology import load_topology

    if target not in EXPORTERS:
        raise InputError("<command line>", "--to", f"unknown target {target!r} (targets: {', '.join(EXPORTERS)})")
    the_plan = load_plan(plan_file)
    ref = topology or plan_topology_ref(the_plan, plan_file) or the_plan.topology
    try:
        topo = load_topology(ref)
    except InputError as exc:
        if topology:
            raise
        key = "topology_source" if the_plan.topology_source else "topology"
        raise InputError(str(plan_file), key, f"cannot load the plan's topology {ref!r} ({exc.reason}); "
                         "give --topology") from None
    if topo.name != the_plan.topology:
        raise InputError(str(plan_file), "topology", f"plan is for {the_plan.topology!r}, topology is {topo.name!r}")
    options = ExportOptions(plan_name=plan_file.stem, image=image, namespace=namespace, source=str(plan_file))
    result = export_plan(the_plan, topo, target, out, options)
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    for path in result.files:
        console.print(f"wrote {path}", highlight=False)
