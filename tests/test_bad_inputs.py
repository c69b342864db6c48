"""Every bad input is a clear error: exit 2, no traceback, the file and each key named, every problem listed.

Each case writes its files into a fresh folder, runs one ``weave`` command in-process (``main(argv)``,
as the console script does) and checks the error printed on stderr:

- the exit code is 2 and no "Traceback" is printed;
- the first line names the file (and, for several problems, their count: exactly the expected ones);
- each expected problem is listed as ``KEY: ...REASON...`` (one per line when there are several).

A few cases run the real console script in a subprocess to prove the same end to end.
"""

from __future__ import annotations

import copy
import errno
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from weave_rl.cli.app import main

DROP = object()  # a key to delete from the base input

JOB = {
    "name": "A", "params_b": 7, "slo": 1.5,
    "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": 120, "host_mem_gb": 275.7},
    "train": {"gpus": 8, "gpu_type": "H800", "duration_s": 100, "host_mem_gb": 240},
}
TOPOLOGY = {
    "name": "t",
    "clusters": [{"name": "rollout", "gpu_type": "H20", "nodes": 2, "gpus_per_node": 8, "fabric_gbps": 400},
                 {"name": "train", "gpu_type": "H800", "nodes": 2}],
    "links": [{"between": ["rollout", "train"], "gbps": 20, "latency_ms": 1}],
}
PLAN = {
    "version": 1, "policy": "optimal", "quantile": 0.95, "topology": "weave-testbed", "cost_usd_per_hour": 57.04,
    "solver": {"name": "cpsat", "status": "OPTIMAL", "wall_s": 1.0},
    "groups": [{"name": "g0", "cycle_s": 230.0, "nodes": ["rollout-000", "train-000"],
                "jobs": [{"name": "A", "solo_iteration_s": 229.0, "iteration_s": 230.0, "slo": 1.5, "phases": [
                    {"phase": "rollout", "start_s": 0.0, "duration_s": 120.0, "gpus": ["rollout-000:0"]},
                    {"phase": "train", "start_s": 120.0, "duration_s": 100.0, "gpus": ["train-000:0"]},
                    {"phase": "sync", "start_s": 220.0, "duration_s": 1.0, "gpus": ["rollout-000:0"]}]}]}],
    "rejected": [], "elastic": {},
}
RECORD_HEADER = "job,iteration,phase,gpus,gpu_type,start_s,duration_s,switch_s,tokens"
RECORD_ROW = "A,0,rollout,8,H20,0,120,0.5,1000"


def edit(base: Any, changes: dict[str, Any]) -> Any:
    """A deep copy of ``base`` with ``changes`` applied: ``{"jobs.0.rollout.gpus": True}`` (DROP deletes)."""
    data = copy.deepcopy(base)
    for path, value in changes.items():
        *head, last = path.split(".")
        node = data
        for part in head:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            last = int(last)
        if value is DROP:
            del node[last]
        else:
            node[last] = value
    return data


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def jobs_yaml(*jobs: dict) -> str:
    return dump({"jobs": list(jobs)})


def job(**changes: Any) -> dict:
    """The good job with changes, keys written with ``__`` for dots (``rollout__gpus=0``)."""
    return edit(JOB, {k.replace("__", "."): v for k, v in changes.items()})


def topo(changes: dict[str, Any]) -> str:
    return dump(edit(TOPOLOGY, changes))


def plan(changes: dict[str, Any]) -> str:
    return dump(edit(PLAN, changes))


def records(*rows: str, header: str = RECORD_HEADER) -> str:
    return "\n".join([header, *rows]) + "\n"


@dataclass
class Case:
    id: str
    files: dict[str, str | bytes]
    args: list[str]  # "{d}" is the case's folder
    file: str  # named on the first line of the error
    problems: list[tuple[str, str]]  # (key, reason fragment); exactly these, in any order
    env: dict[str, str] = field(default_factory=dict)


def topology_case(id: str, text: str | bytes, problems: list[tuple[str, str]], **kw: Any) -> Case:
    return Case(f"topology-{id}", {"t.yaml": text}, ["topology", "show", "{d}/t.yaml"], "t.yaml", problems, **kw)


def jobs_case(id: str, text: str | bytes, problems: list[tuple[str, str]], **kw: Any) -> Case:
    return Case(f"jobs-{id}", {"j.yaml": text}, ["jobs", "show", "{d}/j.yaml"], "j.yaml", problems, **kw)


def plan_case(id: str, text: str | bytes, problems: list[tuple[str, str]], **kw: Any) -> Case:
    return Case(f"plan-{id}", {"p.yaml": text}, ["plan", "show", "{d}/p.yaml"], "p.yaml", problems, **kw)


def records_case(id: str, text: str | bytes, problems: list[tuple[str, str]], name: str = "r.csv") -> Case:
    return Case(f"records-{id}", {name: text, "j.yaml": jobs_yaml(JOB)},
                ["profile", "fit", "{d}/" + name, "--jobs", "{d}/j.yaml", "-o", "{d}/out.yaml"], name, problems)


def cmd_case(id: str, args: list[str], key: str, reason: str, files: dict | None = None) -> Case:
    return Case(f"cli-{id}", files or {}, args, "<command line>", [(key, reason)])


NOT_UTF8 = b"name: t\nclusters:\n  - name: caf\xe9\n"
DEEP = "a: " + "[" * 3000 + "]" * 3000 + "\n"
BOMB = "".join(f"{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]\n" for p, c in zip("abcdefg", "bcdefgh"))
BOMB = "a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" + BOMB

CASES: list[Case] = [
    # ----- topology files -----------------------------------------------------------------------
    topology_case("nodes-bool", topo({"clusters.0.nodes": True}), [("clusters[0].nodes", "expected an integer, not true/false (got True)")]),
    topology_case("nodes-zero", topo({"clusters.0.nodes": 0}), [("clusters[0].nodes", "greater than 0")]),
    topology_case("nodes-text", topo({"clusters.0.nodes": "many"}), [("clusters[0].nodes", "valid integer")]),
    topology_case("nodes-fraction", topo({"clusters.0.nodes": 2.5}), [("clusters[0].nodes", "valid integer")]),
    topology_case("nodes-huge", topo({"clusters.0.nodes": 100000}), [("clusters[0].nodes", "less than or equal to 9999")]),
    topology_case("gpus-per-node-bool", topo({"clusters.1.gpus_per_node": False}),
                  [("clusters[1].gpus_per_node", "expected an integer, not true/false")]),
    topology_case("fabric-inf", topo({"clusters.0.fabric_gbps": float("inf")}),
                  [("clusters[0].fabric_gbps", "finite number")]),
    topology_case("fabric-nan", topo({"clusters.0.fabric_gbps": float("nan")}),
                  [("clusters[0].fabric_gbps", "finite number")]),
    topology_case("pcie-negative", topo({"clusters.0.pcie_gbps": -1}), [("clusters[0].pcie_gbps", "greater than 0")]),
    topology_case("host-mem-1e308", topo({"clusters.0.host_mem_gb": 1e308}),
                  [("clusters[0].host_mem_gb", "less than or equal to")]),
    topology_case("host-mem-bool", topo({"clusters.0.host_mem_gb": True}),
                  [("clusters[0].host_mem_gb", "expected a number, not true/false")]),
    topology_case("unknown-key", topo({"clusters.0.colour": "red"}), [("clusters[0].colour", "unknown key")]),
    topology_case("unknown-top-key", topo({"region": "eu"}), [("region", "unknown key")]),
    topology_case("unknown-gpu-type", topo({"clusters.1.gpu_type": "H999"}),
                  [("clusters[1].gpu_type", "unknown GPU type 'H999'")]),
    topology_case("name-missing", topo({"name": DROP}), [("name", "required key is missing")]),
    topology_case("name-int", topo({"name": 12}), [("name", "valid string")]),
    topology_case("clusters-empty", topo({"clusters": [], "links": []}), [("clusters", "at least 1 item")]),
    topology_case("clusters-missing", topo({"clusters": DROP, "links": []}), [("clusters", "required key is missing")]),
    topology_case("cluster-bad-name", topo({"clusters.0.name": "roll out", "links": []}),
                  [("clusters[0].name", "should match pattern")]),
    topology_case("link-unknown-cluster", topo({"links.0.between": ["rollout", "nowhere"]}),
                  [("links[0].between[1]", "unknown cluster 'nowhere'")]),
    topology_case("link-to-itself", topo({"links.0.between": ["train", "train"]}),
                  [("links[0].between", "two different clusters")]),
    topology_case("link-gbps-inf", topo({"links.0.gbps": float("inf")}), [("links[0].gbps", "finite number")]),
    topology_case("link-latency-negative", topo({"links.0.latency_ms": -1}),
                  [("links[0].latency_ms", "greater than or equal to 0")]),
    topology_case("duplicate-cluster", topo({"clusters.1.name": "rollout", "links": []}),
                  [("clusters[1].name", "duplicate cluster name 'rollout'")]),
    topology_case("gpu-type-spec-bool", topo({"gpu_types": {"X1": {"tflops_bf16": True, "hbm_gb": 80, "hbm_tbps": 2,
                                                                   "usd_per_hour": 1}}}),
                  [("gpu_types.X1.tflops_bf16", "expected a number, not true/false")]),
    topology_case("gpu-type-spec-inf", topo({"gpu_types": {"X1": {"tflops_bf16": 100, "hbm_gb": float("inf"),
                                                                  "hbm_tbps": 2, "usd_per_hour": 1}}}),
                  [("gpu_types.X1.hbm_gb", "finite number")]),
    topology_case("gpu-type-spec-missing", topo({"gpu_types": {"X1": {"tflops_bf16": 100, "hbm_gb": 80,
                                                                      "hbm_tbps": 2}}}),
                  [("gpu_types.X1.usd_per_hour", "required key is missing")]),
    topology_case("three-bad-values", topo({"clusters.0.nodes": True, "clusters.1.nodes": -3,
                                            "links.0.gbps": 0}),
                  [("clusters[0].nodes", "expected an integer, not true/false"), ("clusters[1].nodes", "greater than 0"),
                   ("links[0].gbps", "greater than 0")]),
    topology_case("missing-beside-bad", topo({"clusters.0.gpu_type": DROP, "clusters.0.nodes": -1}),
                  [("clusters[0].gpu_type", "required key is missing"), ("clusters[0].nodes", "greater than 0")]),
    topology_case("bad-value-beside-unknown-type", topo({"clusters.0.nodes": 0, "clusters.1.gpu_type": "Z9"}),
                  [("clusters[0].nodes", "greater than 0"), ("clusters[1].gpu_type", "unknown GPU type 'Z9'")]),
    topology_case("empty-file", "", [("", "the file is empty")]),
    topology_case("a-list", "- 1\n- 2\n", [("", "expected a mapping")]),
    topology_case("not-utf8", NOT_UTF8, [("", "not UTF-8 text: byte 0xe9 at line 3")]),
    topology_case("malformed", "name: t\nclusters: [\n", [("", "malformed YAML")]),
    topology_case("repeated-key", "name: t\nname: u\nclusters: []\n", [("", "key 'name' appears twice")]),
    topology_case("too-large", "name: t\n" + "# padding\n" * 20000, [("", "file too large")],
                  env={"WEAVE_MAX_INPUT_MB": "0.1"}),
    topology_case("nested-too-deep", DEEP, [("", "malformed YAML")]),
    topology_case("alias-bomb", BOMB, [("", "aliases expand to over")]),
    topology_case("too-many-nodes", topo({"clusters": [{"name": f"c{i}", "gpu_type": "H20", "nodes": 9999}
                                                       for i in range(11)], "links": []}),
                  [("", "109,989 nodes in all; at most 100,000")]),
    Case("topology-directory", {"t.yaml/x": "x"}, ["topology", "show", "{d}/t.yaml"], "t.yaml",
         [("", "is a directory")]),
    Case("topology-missing-file", {}, ["topology", "show", "{d}/none.yaml"], "none.yaml", [("", "file not found")]),
    Case("topology-unknown-preset", {}, ["topology", "show", "weave-tesbed"], "weave-tesbed",
         [("", "unknown topology preset")]),
    Case("topology-preset-scaled-too-far", {}, ["topology", "show", "weave-testbed-x5000"], "weave-testbed-x5000",
         [("", "at most 9,999")]),

    # ----- jobs files ---------------------------------------------------------------------------
    jobs_case("gpus-bool", jobs_yaml(job(rollout__gpus=True)), [("jobs[0].rollout.gpus", "expected an integer, not true/false (got True)")]),
    jobs_case("gpus-zero", jobs_yaml(job(rollout__gpus=0)), [("jobs[0].rollout.gpus", "greater than 0")]),
    jobs_case("gpus-fraction", jobs_yaml(job(train__gpus=8.5)), [("jobs[0].train.gpus", "valid integer")]),
    jobs_case("gpus-text", jobs_yaml(job(train__gpus="8")), [("jobs[0].train.gpus", "valid integer")]),
    jobs_case("gpus-huge", jobs_yaml(job(train__gpus=10**9)), [("jobs[0].train.gpus", "less than or equal to")]),
    jobs_case("duration-1e308", jobs_yaml(job(rollout__duration_s=1e308)),
              [("jobs[0].rollout.duration_s", "at most 1e+08 s")]),
    jobs_case("duration-written-1e308", "jobs:\n- name: A\n  params_b: 7\n  rollout: {gpus: 8, gpu_type: H20, "
              "duration_s: 1e308}\n  train: {gpus: 8, gpu_type: H800, duration_s: 100}\n",
              [("jobs[0].rollout.duration_s", "at most 1e+08 s")]),
    jobs_case("duration-inf", jobs_yaml(job(rollout__duration_s=float("inf"))),
              [("jobs[0].rollout.duration_s", "finite number > 0")]),
    jobs_case("duration-nan", jobs_yaml(job(rollout__duration_s=float("nan"))),
              [("jobs[0].rollout.duration_s", "finite number > 0")]),
    jobs_case("duration-negative", jobs_yaml(job(train__duration_s=-1)),
              [("jobs[0].train.duration_s", "finite number > 0")]),
    jobs_case("duration-zero", jobs_yaml(job(train__duration_s=0)), [("jobs[0].train.duration_s", "> 0")]),
    jobs_case("duration-bool", jobs_yaml(job(train__duration_s=True)), [("jobs[0].train.duration_s", "expected a number")]),
    jobs_case("duration-text", jobs_yaml(job(train__duration_s="fast")),
              [("jobs[0].train.duration_s", "expected a number")]),
    jobs_case("duration-mean-only", jobs_yaml(job(train__duration_s={"mean": 10})),
              [("jobs[0].train.duration_s", "mean also needs std")]),
    jobs_case("duration-p95-below-p50", jobs_yaml(job(train__duration_s={"p50": 20, "p95": 10})),
              [("jobs[0].train.duration_s", "need p50 <= p95")]),
    jobs_case("duration-max-below-p95", jobs_yaml(job(train__duration_s={"p50": 10, "p95": 20, "max": 15})),
              [("jobs[0].train.duration_s", "need p95 <= max")]),
    jobs_case("duration-no-samples", jobs_yaml(job(train__duration_s={"samples": []})),
              [("jobs[0].train.duration_s.samples", "at least 1 item")]),
    jobs_case("duration-negative-sample", jobs_yaml(job(train__duration_s={"samples": [10, -1, 12]})),
              [("jobs[0].train.duration_s.samples[1]", "greater than 0")]),
    jobs_case("duration-mixed-forms", jobs_yaml(job(train__duration_s={"samples": [1], "mean": 2})),
              [("jobs[0].train.duration_s", "do not make one form")]),
    jobs_case("duration-value-key", jobs_yaml(job(train__duration_s={"value": 3})),
              [("jobs[0].train.duration_s", "unknown key 'value'")]),
    jobs_case("duration-std-inf", jobs_yaml(job(train__duration_s={"mean": 10, "std": float("inf")})),
              [("jobs[0].train.duration_s.std", "finite number")]),
    jobs_case("params-missing", jobs_yaml(job(params_b=DROP)), [("jobs[0].params_b", "required key is missing")]),
    jobs_case("params-bool", jobs_yaml(job(params_b=True)), [("jobs[0].params_b", "expected a number, not true/false")]),
    jobs_case("params-1e308", jobs_yaml(job(params_b=1e308)), [("jobs[0].params_b", "less than or equal to")]),
    jobs_case("bytes-per-param-zero", jobs_yaml(job(bytes_per_param=0)), [("jobs[0].bytes_per_param", "greater than 0")]),
    jobs_case("slo-zero", jobs_yaml(job(slo=0)), [("jobs[0].slo", "greater than 0")]),
    jobs_case("slo-bool", jobs_yaml(job(slo=True)), [("jobs[0].slo", "expected a number, not true/false")]),
    jobs_case("staleness-two", jobs_yaml(job(max_staleness=2)), [("jobs[0].max_staleness", "0 or 1")]),
    jobs_case("staleness-bool", jobs_yaml(job(max_staleness=True)), [("jobs[0].max_staleness", "0 or 1")]),
    jobs_case("iterations-zero", jobs_yaml(job(iterations=0)), [("jobs[0].iterations", "greater than 0")]),
    jobs_case("iterations-bool", jobs_yaml(job(iterations=True)), [("jobs[0].iterations", "expected an integer, not true/false")]),
    jobs_case("arrival-negative", jobs_yaml(job(arrival_s=-5)), [("jobs[0].arrival_s", "greater than or equal to 0")]),
    jobs_case("host-mem-inf", jobs_yaml(job(rollout__host_mem_gb=float("inf"))),
              [("jobs[0].rollout.host_mem_gb", "finite number")]),
    jobs_case("scaling-lengths", jobs_yaml(job(rollout__scaling={"gpus": [8, 16], "duration_s": [120]})),
              [("jobs[0].rollout.scaling", "differ in length")]),
    jobs_case("scaling-order", jobs_yaml(job(rollout__scaling={"gpus": [16, 8], "duration_s": [60, 120]})),
              [("jobs[0].rollout.scaling", "strictly increasing")]),
    jobs_case("scaling-bool-gpus", jobs_yaml(job(rollout__scaling={"gpus": [True, 16], "duration_s": [60, 120]})),
              [("jobs[0].rollout.scaling.gpus[0]", "expected an integer, not true/false")]),
    jobs_case("gpu-options-empty", jobs_yaml(job(rollout__gpu_options=[])),
              [("jobs[0].rollout.gpu_options", "at least 1 item")]),
    jobs_case("gpu-options-bool", jobs_yaml(job(rollout__gpu_options=[8, True])),
              [("jobs[0].rollout.gpu_options[1]", "expected an integer, not true/false")]),
    jobs_case("gpu-types-unknown", jobs_yaml(job(rollout__gpu_types=["H20", "H999"])),
              [("jobs[0].rollout.gpu_types[1]", "unknown GPU type 'H999'")]),
    jobs_case("gpu-type-unknown", jobs_yaml(job(train__gpu_type="B300")),
              [("jobs[0].train.gpu_type", "unknown GPU type 'B300'")]),
    jobs_case("unknown-job-key", jobs_yaml(job(colour="red")), [("jobs[0].colour", "unknown key")]),
    jobs_case("unknown-phase-key", jobs_yaml(job(train__tp=4)), [("jobs[0].train.tp", "unknown key")]),
    jobs_case("phase-kind-key", jobs_yaml(job(train__kind="train")), [("jobs[0].train", "unknown key 'kind'")]),
    jobs_case("name-blank", jobs_yaml(job(name="  ")), [("jobs[0].name", "must not be blank")]),
    jobs_case("name-int", jobs_yaml(job(name=12)), [("jobs[0].name", "valid string")]),
    jobs_case("duplicate-names", jobs_yaml(JOB, job(slo=2.0)), [("jobs[1].name", "duplicate job name 'A'")]),
    jobs_case("unknown-top-key", dump({"jobs": [JOB], "defaults": {}}), [("defaults", "unknown key")]),
    jobs_case("jobs-missing", dump({"job": [JOB]}), [("job", "unknown key"), ("jobs", "required key is missing")]),
    jobs_case("jobs-a-number", dump({"jobs": 5}), [("jobs", "expected a list of jobs")]),
    jobs_case("job-a-list", jobs_yaml([1, 2]), [("jobs[0]", "expected a mapping (one job)")]),
    jobs_case("train-missing", jobs_yaml(job(train=DROP)), [("jobs[0].train", "required key is missing")]),
    jobs_case("rollout-a-number", jobs_yaml(job(rollout=5)), [("jobs[0].rollout", "valid dictionary")]),
    jobs_case("workload-kind-int", jobs_yaml(job(workload={"kind": 3})), [("jobs[0].workload", "must be a string")]),
    jobs_case("missing-beside-bad", jobs_yaml(job(train__gpus=DROP, rollout__gpus=-1)),
              [("jobs[0].train.gpus", "required key is missing"), ("jobs[0].rollout.gpus", "greater than 0")]),
    jobs_case("missing-beside-unknown-type", jobs_yaml(job(params_b=DROP, rollout__gpu_type="H21")),
              [("jobs[0].params_b", "required key is missing"), ("jobs[0].rollout.gpu_type", "unknown GPU type 'H21'")]),
    jobs_case("three-bad-jobs", jobs_yaml(job(rollout__gpus=0), job(name="B", slo=True),
                                          job(name="C", train__duration_s=-1)),
              [("jobs[0].rollout.gpus", "greater than 0"), ("jobs[1].slo", "expected a number, not true/false"),
               ("jobs[2].train.duration_s", "finite number > 0")]),
    jobs_case("five-problems-two-jobs", jobs_yaml(job(rollout__gpus=True, train__gpu_type="H21", colour=1),
                                                  job(params_b=DROP, rollout__duration_s=1e308)),
              [("jobs[0].rollout.gpus", "expected an integer, not true/false"), ("jobs[0].colour", "unknown key"),
               ("jobs[0].train.gpu_type", "unknown GPU type 'H21'"), ("jobs[1].params_b", "required key is missing"),
               ("jobs[1].rollout.duration_s", "at most 1e+08 s"), ("jobs[1].name", "duplicate job name 'A'")]),
    jobs_case("null-values", "jobs:\n- name: A\n  params_b:\n  rollout:\n  train: {gpus: 8, gpu_type: H800, "
              "duration_s: 100}\n",
              [("jobs[0].params_b", "valid number (got null: the key has no value)"),
               ("jobs[0].rollout", "valid dictionary (got null: the key has no value)")]),
    jobs_case("python-tag", "jobs: !!python/object:os.system {}\n", [("", "could not determine a constructor")]),
    jobs_case("empty-file", "", [("", "the file is empty")]),
    jobs_case("not-utf8", b"jobs:\n  - name: \xff\xfe\n", [("", "not UTF-8 text: byte 0xff at line 2")]),
    jobs_case("repeated-key", "jobs:\n  - name: A\n    name: B\n", [("", "key 'name' appears twice")]),
    jobs_case("tab-indent", "jobs:\n\t- name: A\n", [("", "malformed YAML: line 2")]),
    jobs_case("too-large", jobs_yaml(*[job(name=f"J{i}") for i in range(600)]), [("", "file too large")],
              env={"WEAVE_MAX_INPUT_MB": "0.05"}),
    Case("jobs-do-not-fit-the-topology", {"j.yaml": jobs_yaml(job(rollout__gpus=4096),
                                                       job(name="B", train__host_mem_gb=9000))},
         ["jobs", "show", "{d}/j.yaml", "-t", "weave-testbed"], "j.yaml",
         [("jobs[0].rollout.gpus", "4096"), ("jobs[1].train.host_mem_gb", "exceeds every node's host memory")]),
    Case("jobs-bad-quantile", {"j.yaml": jobs_yaml(JOB)}, ["jobs", "show", "{d}/j.yaml", "-q", "1.5"],
         "<command line>", [("--quantile", "number in (0, 1]")]),
    Case("jobs-custom-type-unknown-without-topology", {"j.yaml": jobs_yaml(job(train__gpu_type="X1"))},
         ["jobs", "show", "{d}/j.yaml"], "j.yaml", [("jobs[0].train.gpu_type", "unknown GPU type 'X1'")]),

    # ----- plan files ---------------------------------------------------------------------------
    plan_case("version-2", plan({"version": 2}), [("version", "unsupported plan version")]),
    plan_case("version-bool", plan({"version": True}), [("version", "unsupported plan version")]),
    plan_case("policy-missing", plan({"policy": DROP}), [("policy", "required key is missing")]),
    plan_case("cost-bool", plan({"cost_usd_per_hour": True}), [("cost_usd_per_hour", "expected a number")]),
    plan_case("cost-negative", plan({"cost_usd_per_hour": -1}), [("cost_usd_per_hour", "greater than or equal to 0")]),
    plan_case("start-inf", plan({"groups.0.jobs.0.phases.1.start_s": float("inf")}),
              [("groups[0].jobs[0].phases[1].start_s", "finite number")]),
    plan_case("start-negative", plan({"groups.0.jobs.0.phases.0.start_s": -1}),
              [("groups[0].jobs[0].phases[0].start_s", "greater than or equal to 0")]),
    plan_case("duration-1e308", plan({"groups.0.jobs.0.phases.0.duration_s": 1e308}),
              [("groups[0].jobs[0].phases[0].duration_s", "less than or equal to")]),
    plan_case("duration-text", plan({"groups.0.jobs.0.phases.0.duration_s": "120"}),
              [("groups[0].jobs[0].phases[0].duration_s", "expected a number")]),
    plan_case("cycle-zero", plan({"groups.0.cycle_s": 0}), [("groups[0].cycle_s", "greater than 0")]),
    plan_case("unknown-phase", plan({"groups.0.jobs.0.phases.2.phase": "warmup"}),
              [("groups[0].jobs[0].phases[2].phase", "'rollout', 'train' or 'sync'")]),
    plan_case("phase-no-gpus", plan({"groups.0.jobs.0.phases.0.gpus": []}),
              [("groups[0].jobs[0].phases[0].gpus", "at least 1 item")]),
    plan_case("quantile-two", plan({"quantile": 2}), [("quantile", "less than or equal to 1")]),
    plan_case("quantile-text", plan({"quantile": "median"}), [("quantile", "Input should be 'max'")]),
    plan_case("group-no-nodes", plan({"groups.0.nodes": []}), [("groups[0].nodes", "at least 1 item")]),
    plan_case("unknown-key", plan({"owner": "me"}), [("owner", "unknown key")]),
    plan_case("solver-missing", plan({"solver": DROP}), [("solver", "required key is missing")]),
    plan_case("four-problems", plan({"version": 2, "groups.0.cycle_s": True, "groups.0.jobs.0.iteration_s": -1,
                                     "groups.0.jobs.0.phases.1.phase": "x"}),
              [("version", "unsupported plan version"), ("groups[0].cycle_s", "expected a number"),
               ("groups[0].jobs[0].iteration_s", "greater than 0"),
               ("groups[0].jobs[0].phases[1].phase", "'rollout', 'train' or 'sync'")]),
    plan_case("empty-file", "", [("", "the file is empty")]),
    plan_case("a-list", "[1]\n", [("", "expected a mapping (a Weave plan)")]),
    plan_case("not-utf8", b"version: 1\npolicy: \xc3\x28\n", [("", "not UTF-8 text")]),
    Case("plan-check-version-2", {"p.yaml": plan({"version": 2}), "j.yaml": jobs_yaml(JOB)},
         ["plan", "check", "{d}/p.yaml", "-t", "weave-testbed", "-j", "{d}/j.yaml"], "p.yaml",
         [("version", "unsupported plan version")]),
    Case("plan-export-version-2", {"p.yaml": plan({"version": 2})},
         ["plan", "export", "{d}/p.yaml", "--to", "verl", "-o", "{d}/out"], "p.yaml",
         [("version", "unsupported plan version")]),
    Case("plan-from-bad-plan", {"p.yaml": plan({"groups.0.cycle_s": -1}), "j.yaml": jobs_yaml(JOB)},
         ["plan", "-t", "weave-testbed", "-j", "{d}/j.yaml", "--from", "{d}/p.yaml"], "p.yaml",
         [("groups[0].cycle_s", "greater than 0")]),
    Case("plan-from-a-plan-on-another-topology", {"p.yaml": plan({}), "j.yaml": jobs_yaml(JOB)},
         ["plan", "-t", "a100-32", "-j", "{d}/j.yaml", "--from", "{d}/p.yaml"], "p.yaml",
         [("topology", "plan is for 'weave-testbed', the topology given is 'a100-32'"),
          ("groups[0].nodes[0]", "unknown node 'rollout-000'"), ("groups[0].nodes[1]", "unknown node 'train-000'"),
          ("groups[0].jobs[0].phases[0].gpus", "GPU 'rollout-000:0' not in topology 'a100-32'"),
          ("groups[0].jobs[0].phases[1].gpus", "GPU 'train-000:0' not in"),
          ("groups[0].jobs[0].phases[2].gpus", "GPU 'rollout-000:0' not in")]),
    Case("plan-replan-on-another-topology", {"p.yaml": plan({"groups.0.nodes": ["rollout-000"],
                                                             "groups.0.jobs.0.phases.1.gpus": ["rollout-000:1"]}),
                                             "j.yaml": jobs_yaml(JOB)},
         ["plan", "replan", "{d}/p.yaml", "-j", "{d}/j.yaml", "-t", "local"], "p.yaml",
         [("topology", "plan is for 'weave-testbed'"), ("groups[0].nodes[0]", "unknown node 'rollout-000'"),
          ("groups[0].jobs[0].phases[0].gpus", "not in topology 'local'"),
          ("groups[0].jobs[0].phases[1].gpus", "not in topology 'local'"),
          ("groups[0].jobs[0].phases[2].gpus", "not in topology 'local'")]),
    Case("plan-bad-jobs", {"j.yaml": jobs_yaml(job(rollout__gpus=True), job(name="B", train__gpu_type="Q"))},
         ["plan", "-t", "weave-testbed", "-j", "{d}/j.yaml"], "j.yaml",
         [("jobs[0].rollout.gpus", "expected an integer, not true/false"), ("jobs[1].train.gpu_type", "unknown GPU type 'Q'")]),
    Case("plan-check-three-bad-files", {"t.yaml": topo({"clusters.0.nodes": True}),
                                        "j.yaml": jobs_yaml(job(rollout__gpus=0, train__gpu_type="X9")),
                                        "p.yaml": plan({"version": 2})},
         ["plan", "check", "{d}/p.yaml", "-t", "{d}/t.yaml", "-j", "{d}/j.yaml"], "problems in",
         [("t.yaml: clusters[0].nodes", "not true/false"), ("j.yaml: jobs[0].rollout.gpus", "greater than 0"),
          ("p.yaml: version", "unsupported plan version")]),  # X9: the broken topology may have defined it
    Case("simulate-plan-version-2", {"p.yaml": plan({"version": 2}), "j.yaml": jobs_yaml(JOB)},
         ["simulate", "{d}/p.yaml", "-j", "{d}/j.yaml", "--out", "{d}/sim"], "p.yaml",
         [("version", "unsupported plan version")]),

    Case("plan-show-unknown-nodes-and-gpus", {"p.yaml": plan({"groups.0.nodes": ["rollout-000", "train-999"],
                                                              "groups.0.jobs.0.phases.1.gpus": ["train-000:8"],
                                                              "groups.0.jobs.0.phases.2.gpus": ["nocolon"]})},
         ["plan", "show", "{d}/p.yaml", "-t", "weave-testbed"], "p.yaml",
         [("groups[0].nodes[1]", "unknown node 'train-999' in topology 'weave-testbed'"),
          ("groups[0].jobs[0].phases[1].gpus", "GPU 'train-000:8' not in topology"),
          ("groups[0].jobs[0].phases[2].gpus", "GPU 'nocolon' not in topology")]),
    Case("simulate-plan-and-jobs-disagree", {"p.yaml": plan({"groups.0.jobs.0.name": "Z",
                                                             "groups.0.nodes": ["rollout-000", "train-999"]}),
                                             "j.yaml": jobs_yaml(JOB)},
         ["simulate", "{d}/p.yaml", "-j", "{d}/j.yaml", "--out", "{d}/sim"], "problems in",
         [("jobs", "plan job 'Z' is not in the jobs file"), ("groups[0].nodes[1]", "unknown node 'train-999'")]),

    # ----- measured records (weave profile fit) -------------------------------------------------
    records_case("six-missing-columns", records("A,0,rollout", header="job,iteration,phase"),
                 [(c, "required column is missing") for c in ("gpus", "gpu_type", "start_s", "duration_s", "switch_s")]),
    records_case("only-job-column", records("A", header="job"),
                 [(c, "required column is missing") for c in ("iteration", "phase", "gpus", "gpu_type", "start_s",
                                                              "duration_s", "switch_s")]),
    records_case("three-bad-numeric-columns", records("A,x,rollout,8,H20,0,120,0.5,1", "A,1,rollout,eight,H20,0,y,0.5,1"),
                 [("row 0.iteration", "expected a number (got 'x')"), ("row 1.gpus", "expected a number (got 'eight')"),
                  ("row 1.duration_s", "expected a number (got 'y')")]),
    records_case("gpus-true", records("A,0,rollout,true,H20,0,120,0.5,1"), [("row 0.gpus", "expected a number")]),
    records_case("duration-inf", records("A,0,rollout,8,H20,0,inf,0.5,1"), [("row 0.duration_s", "finite number")]),
    records_case("duration-zero-many-rows", records(*[f"A,{i},rollout,8,H20,0,0,0.5,1" for i in range(12)]),
                 [("row 0.duration_s", "duration must be > 0 (got 0.0); also rows 1, 2, 3, 4, 5, 6, 7, 8, 9, ... "
                                       "(12 rows in all)")]),
    records_case("iteration-negative", records("A,-1,rollout,8,H20,0,120,0.5,1"),
                 [("row 0.iteration", "iteration >= 0")]),
    records_case("iteration-fraction", records(RECORD_ROW, "A,1.5,rollout,8,H20,0,120,0.5,1"),
                 [("row 1.iteration", "expected an integer")]),
    records_case("switch-negative-tokens-negative", records("A,0,rollout,8,H20,0,120,-0.5,-1"),
                 [("row 0.switch_s", "switch time must be >= 0"), ("row 0.tokens", "token count must be >= 0")]),
    records_case("missing-values", records("A,,rollout,8,H20,0,120,0.5,1", ",1,,8,H20,0,120,0.5,1"),
                 [("row 0.iteration", "missing value"), ("row 1.job", "missing value"), ("row 1.phase", "missing value")]),
    records_case("unknown-gpu-type", records("A,0,rollout,8,H999,0,120,0.5,1", "A,1,rollout,8,H999,0,120,0.5,1"),
                 [("row 0.gpu_type", "unknown GPU type 'H999' (known: A100, A800, CPU, H100, H20, H200, H800, L40S); "
                                     "also row 1 (2 rows in all)")]),
    records_case("unknown-phase-and-job", records(RECORD_ROW, "B,0,warmup,8,H20,0,120,0.5,1"),
                 [("row 1.phase", "unknown phase 'warmup'"), ("row 1.job", "job 'B' is not in the jobs file")]),
    records_case("bad-number-beside-unknown-names", records("A,x,rollout,8,H20,0,120,0.5,1", "B,1,warmup,8,H20,0,-3,0,1"),
                 [("row 0.iteration", "expected a number (got 'x')"), ("row 1.duration_s", "duration must be > 0"),
                  ("row 1.phase", "unknown phase 'warmup'"), ("row 1.job", "job 'B' is not in the jobs file")]),
    records_case("gpus-and-duration-too-large", records("A,0,rollout,1000000,H20,0,1e12,0.5,1"),
                 [("row 0.gpus", "GPU count <= 100,000"), ("row 0.duration_s", "at most 1e+08 s")]),
    records_case("empty-file", "", [("", "cannot read csv records")]),
    Case("records-too-large", {"r.csv": records(*[RECORD_ROW] * 5000), "j.yaml": jobs_yaml(JOB)},
         ["profile", "fit", "{d}/r.csv", "--jobs", "{d}/j.yaml", "-o", "{d}/out.yaml"], "r.csv",
         [("", "file too large")], env={"WEAVE_MAX_INPUT_MB": "0.001"}),
    Case("records-a-directory", {"r.csv/x": "", "j.yaml": jobs_yaml(JOB)},
         ["profile", "fit", "{d}/r.csv", "--jobs", "{d}/j.yaml", "-o", "{d}/out.yaml"], "r.csv",
         [("", "is a directory")]),
    records_case("not-utf8", b"job,iteration\n\xff\xfe,1\n", [("", "cannot read csv records")]),
    records_case("unsupported-suffix", records(RECORD_ROW), [("", "unsupported records format '.txt'")], name="r.txt"),
    Case("records-and-jobs-both-bad", {"r.csv": records("A,0,rollout", header="job,iteration,phase"),
                                       "j.yaml": jobs_yaml(job(slo=True))},
         ["profile", "fit", "{d}/r.csv", "--jobs", "{d}/j.yaml", "-o", "{d}/out.yaml"], "problems in",
         [("jobs[0].slo", "expected a number, not true/false")] + [(c, "required column is missing")
                                              for c in ("gpus", "gpu_type", "start_s", "duration_s", "switch_s")]),

    # ----- command lines and output paths -------------------------------------------------------
    cmd_case("plan-out-a-directory", ["plan", "-t", "weave-testbed", "-j", "{d}/j.yaml", "-o", "{d}"],
             "--out", "is a directory; give a file name", {"j.yaml": jobs_yaml(JOB)}),
    cmd_case("plan-out-under-proc", ["plan", "-t", "weave-testbed", "-j", "{d}/j.yaml", "-o", "/proc/weave/p.yaml"],
             "--out", "virtual file system", {"j.yaml": jobs_yaml(JOB)}),
    cmd_case("plan-out-below-a-file", ["plan", "-t", "weave-testbed", "-j", "{d}/j.yaml", "-o", "{d}/j.yaml/p.yaml"],
             "--out", "is a file, so", {"j.yaml": jobs_yaml(JOB)}),
    cmd_case("plan-bad-quantile", ["plan", "-t", "weave-testbed", "-j", "{d}/j.yaml", "-q", "nope"],
             "--quantile", "number in (0, 1] or 'max'", {"j.yaml": jobs_yaml(JOB)}),
    cmd_case("plan-unknown-policy", ["plan", "-t", "weave-testbed", "-j", "{d}/j.yaml", "--policy", "fastest"],
             "--policy", "unknown policy 'fastest'", {"j.yaml": jobs_yaml(JOB)}),
    cmd_case("simulate-out-an-existing-file", ["simulate", "-t", "weave-testbed", "-j", "{d}/j.yaml", "--out", "{d}/j.yaml"],
             "--out", "is an existing file, not a folder", {"j.yaml": jobs_yaml(JOB)}),
    cmd_case("simulate-out-under-proc", ["simulate", "-t", "weave-testbed", "-j", "{d}/j.yaml", "--out", "/proc/weave"],
             "--out", "virtual file system", {"j.yaml": jobs_yaml(JOB)}),
    cmd_case("run-out-an-existing-file", ["run", "{d}/p.yaml", "-j", "{d}/j.yaml", "--out", "{d}/j.yaml"],
             "--out", "is an existing file, not a folder", {"j.yaml": jobs_yaml(JOB), "p.yaml": plan({})}),
    cmd_case("run-out-under-proc", ["run", "{d}/p.yaml", "-j", "{d}/j.yaml", "--out", "/proc/self/weave"],
             "--out", "virtual file system", {"j.yaml": jobs_yaml(JOB), "p.yaml": plan({})}),
    cmd_case("run-resume-a-file", ["run", "--resume", "{d}/j.yaml"], "--resume", "is a file, not a run folder",
             {"j.yaml": jobs_yaml(JOB)}),
    cmd_case("jobs-generate-out-a-directory", ["jobs", "generate", "micro", "-n", "2", "-o", "{d}"],
             "--out", "is a directory"),
    cmd_case("profile-fit-out-a-directory", ["profile", "fit", "{d}/r.csv", "-j", "{d}/j.yaml", "-o", "{d}"],
             "--out", "is a directory", {"j.yaml": jobs_yaml(JOB), "r.csv": records(RECORD_ROW)}),
    cmd_case("plan-show-png-a-directory", ["plan", "show", "{d}/p.yaml", "--png", "{d}"], "--png", "is a directory",
             {"p.yaml": plan({})}),
    cmd_case("plan-admit-out-a-directory", ["plan", "admit", "{d}/p.yaml", "--job", "A", "-j", "{d}/j.yaml", "-o", "{d}"],
             "--out", "is a directory", {"p.yaml": plan({}), "j.yaml": jobs_yaml(JOB)}),
    Case("run-resume-empty-run-json", {"run/run.json": ""}, ["run", "--resume", "{d}/run"], "run.json",
         [("", "empty (the run was cut off before it started)")]),
    Case("run-resume-corrupt-run-json", {"run/run.json": '{"plan": "p.yaml", "jobs'}, ["run", "--resume", "{d}/run"],
         "run.json", [("", "not valid JSON: line 1")]),
    Case("run-resume-run-json-a-list", {"run/run.json": "[1, 2]"}, ["run", "--resume", "{d}/run"], "run.json",
         [("", "expected a JSON object")]),
    Case("run-resume-run-json-bad-values", {"run/run.json": '{"plan": 3, "topology": "local", "iterations": true, '
                                                           '"seed": -1}'},
         ["run", "--resume", "{d}/run"], "run.json",
         [("plan", "expected a file name"), ("jobs", "required key is missing"),
          ("iterations", "expected an integer >= 1 (got True)"), ("seed", "expected an integer >= 0")]),
    Case("run-resume-not-utf8", {"run/run.json": b'{"plan": "\xff"}'}, ["run", "--resume", "{d}/run"], "run.json",
         [("", "not UTF-8 text")]),
    Case("run-resume-no-run-json", {"run/x": ""}, ["run", "--resume", "{d}/run"], "run",
         [("run.json", "not a weave run folder")]),

    # ----- framework logs (weave profile import) ------------------------------------------------
    Case("import-config-not-utf8", {"log.txt": "step:1 - timing_s/gen:1.0\n", "c.json": b'{"a": "\xff"}'},
         ["profile", "import", "--from", "verl", "{d}/log.txt", "-o", "{d}/r.csv", "--gpu-type", "H800",
          "--config", "{d}/c.json"], "c.json", [("", "not UTF-8 text")]),
    Case("import-config-bool-nodes", {"log.txt": "step:1 - timing_s/gen:1.0 - timing_s/update_actor:2.0\n",
                                      "c.json": '{"trainer": {"nnodes": true, "n_gpus_per_node": 8}}'},
         ["profile", "import", "--from", "verl", "{d}/log.txt", "-o", "{d}/r.csv", "--gpu-type", "H800",
          "--config", "{d}/c.json"], "c.json", [("trainer.nnodes", "expected a positive integer (got True)")]),
    Case("import-config-too-many-gpus", {"log.txt": "step:1 - timing_s/gen:1.0 - timing_s/update_actor:2.0\n",
                                         "c.json": '{"trainer": {"nnodes": 99999999, "n_gpus_per_node": 8}}'},
         ["profile", "import", "--from", "verl", "{d}/log.txt", "-o", "{d}/r.csv", "--gpu-type", "H800",
          "--config", "{d}/c.json"], "c.json", [("trainer.nnodes", "expected at most 100,000 GPUs")]),
    Case("import-roll-range-step-zero", {"log.txt": 'metrics_tag: {"step": 0, "metrics": {"time/step_generate": 138.0, '
                                                    '"time/step_train": 105.0}}\n', "c.yaml": "actor_train: {device_mapping: 'list(range(0,8,0))'}\n"},
         ["profile", "import", "--from", "roll", "{d}/log.txt", "-o", "{d}/r.csv", "--gpu-type", "H800",
          "--config", "{d}/c.yaml"], "c.yaml", [("actor_train.device_mapping", "step > 0")]),
    Case("import-config-nested-too-deeply", {"log.txt": "step:1 - timing_s/gen:1.0\n",
                                             "c.json": '{"a": ' + "[" * 200_000 + "]" * 200_000 + "}"},
         ["profile", "import", "--from", "verl", "{d}/log.txt", "-o", "{d}/r.csv", "--gpu-type", "H800",
          "--config", "{d}/c.json"], "c.json", [("", "nested too deeply")]),
    Case("import-log-json-nested-too-deeply", {"log.jsonl": '{"step": 1, "a": ' + "[" * 200_000 + "]" * 200_000 + "}\n"},
         ["profile", "import", "--from", "verl", "{d}/log.jsonl", "-o", "{d}/r.csv", "--gpu-type", "H800",
          "--train-gpus", "8"], "log.jsonl", [("", "no usable veRL step (1 line skipped: 1 (JSON nested too deeply))")]),
    Case("run-resume-run-json-nested-too-deeply", {"run/run.json": "[" * 200_000 + "]" * 200_000},
         ["run", "--resume", "{d}/run"], "run.json", [("", "nested too deeply")]),
    Case("import-log-a-directory", {"logs/x": ""},
         ["profile", "import", "--from", "verl", "{d}/logs", "-o", "{d}/r.csv", "--gpu-type", "H800"], "logs",
         [("", "is a directory")]),
]


def _write(folder: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def check_error(text: str, case: Case) -> None:
    """``text`` (stderr) is the error of ``case``: first line names the file (and the count), every
    expected problem is there, and no other."""
    assert "Traceback" not in text, text
    lines = text.rstrip("\n").split("\n")
    assert lines[0].startswith("error: "), text
    head = lines[0].removeprefix("error: ")
    n = len(case.problems)
    if n == 1:
        assert len(lines) == 1, text
        key, reason = case.problems[0]
        assert case.file in head, (case.file, text)
        where = f"{key}: " if key else ""
        assert re.search(re.escape(case.file) + r"[^:]*: " + re.escape(where), head), (case.problems, text)
        assert reason in head, (reason, text)
        return
    assert re.search(rf"\b{n} problems\b", head), (n, text)
    assert case.file in head, (case.file, text)
    body = lines[1:]
    assert len(body) == n, text  # exactly the expected problems, one per line
    for key, reason in case.problems:
        hits = [line for line in body if re.search(rf"(^|: |/){re.escape(key)}: ", line.strip()) and reason in line]
        assert hits, (key, reason, text)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("WEAVE_DEBUG", raising=False)
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    _write(tmp_path, case.files)
    args = [a.replace("{d}", str(tmp_path)) for a in case.args]
    code = main(args)
    captured = capsys.readouterr()
    assert code == 2, (args, captured.out, captured.err)
    assert "Traceback" not in captured.out
    check_error(captured.err, case)


def test_enough_cases() -> None:
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("args, files", [
    (["topology", "show", "{d}/t.yaml"], {"t.yaml": dump(TOPOLOGY)}),
    (["jobs", "show", "{d}/j.yaml"], {"j.yaml": jobs_yaml(JOB)}),
    (["plan", "show", "{d}/p.yaml"], {"p.yaml": plan({})}),
    (["profile", "fit", "{d}/r.csv", "-j", "{d}/j.yaml", "-o", "{d}/out.yaml"],
     {"r.csv": records(RECORD_ROW), "j.yaml": jobs_yaml(JOB)}),
    (["jobs", "show", "{d}/j.yaml"], {"j.yaml": "jobs:\n- name: A\n  params_b: 7\n  rollout: {gpus: 8, gpu_type: H20, "
                                                 "duration_s: 1.2e2}\n  train: {gpus: 8, gpu_type: H800, duration_s: 1e2}\n"}),
    (["jobs", "show", "{d}/j.yaml"], {"j.yaml": "\ufeff" + jobs_yaml(JOB).replace("\n", "\r\n")}),  # BOM, CRLF
    # A merge key's values may be overridden: that is no repeated key.
    (["jobs", "show", "{d}/j.yaml"], {"j.yaml": "jobs:\n- name: A\n  params_b: 7\n  rollout: &r {gpus: 8, "
                                                 "gpu_type: H20, duration_s: 100}\n  train: {<<: *r, gpu_type: H800}\n"}),
])
def test_the_bases_are_valid(args, files, tmp_path, capsys) -> None:
    """The good inputs the cases break are accepted, so each case fails for its own change only."""
    _write(tmp_path, files)
    code = main([a.replace("{d}", str(tmp_path)) for a in args])
    assert code == 0, capsys.readouterr()


def test_full_disk_is_reported_and_the_temporary_file_removed(tmp_path, capsys, monkeypatch) -> None:
    import weave_rl.core.yamlio as yamlio

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(yamlio.os, "fsync", full)
    out = tmp_path / "jobs.yaml"
    assert main(["jobs", "generate", "micro", "-n", "2", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: {out}: cannot write: no space left on device", err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "temporary file left behind"


def test_full_disk_for_records_is_reported(tmp_path, monkeypatch) -> None:
    import pandas as pd

    from weave_rl.core.errors import InputError
    from weave_rl.profiles.records import records_frame, write_records

    def full(self, path, *a, **k):
        Path(path).write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    frame = records_frame([{"job": "A", "iteration": 0, "phase": "rollout", "gpus": 8, "gpu_type": "H20",
                            "start_s": 0.0, "duration_s": 1.0, "switch_s": 0.0, "tokens": 1}])
    with pytest.raises(InputError, match="no space left on device"):
        write_records(frame, tmp_path / "r.csv")
    assert list(tmp_path.iterdir()) == []


def test_a_50_mb_yaml_is_refused_at_once(tmp_path, capsys) -> None:
    import time

    path = tmp_path / "big.yaml"
    line = "  - {name: J, params_b: 7, rollout: {gpus: 8, gpu_type: H20, duration_s: 1}, train: {gpus: 8}}\n"
    with path.open("w") as f:
        f.write("jobs:\n")
        f.write(line * (50_000_000 // len(line)))
    start = time.perf_counter()
    assert main(["jobs", "show", str(path)]) == 2
    assert time.perf_counter() - start < 2.0
    err = capsys.readouterr().err
    assert "file too large (50.0 MB; the limit is 8 MB, set WEAVE_MAX_INPUT_MB to raise it)" in err, err


def test_one_problem_keeps_the_one_line_form() -> None:
    from weave_rl.core.errors import InputError, Problem

    one = InputError("a.yaml", "jobs[0].gpus", "bad")
    assert str(one) == "a.yaml: jobs[0].gpus: bad" and (one.file, one.key, one.reason) == ("a.yaml", "jobs[0].gpus", "bad")
    many = InputError.many([Problem("a.yaml", "x", "r1"), Problem("a.yaml", "", "r2")])
    assert str(many) == "a.yaml: 2 problems\n  x: r1\n  r2" and many.key == "x"
    mixed = InputError.many([("a.yaml", "x", "r1"), ("b.csv", "y", "r2")])
    assert str(mixed) == "2 problems in a.yaml, b.csv\n  a.yaml: x: r1\n  b.csv: y: r2"


def test_markup_in_values_is_printed_verbatim(tmp_path, capsys) -> None:
    path = tmp_path / "j.yaml"
    path.write_text(jobs_yaml(job(train__gpu_type="[bold]H1[/bold]")))
    assert main(["jobs", "show", str(path)]) == 2
    assert "unknown GPU type '[bold]H1[/bold]'" in capsys.readouterr().err


# ----- end to end: the console script itself ----------------------------------------------------
SUBPROCESS_CASES = ["jobs-not-utf8", "jobs-three-bad-jobs", "topology-nodes-bool", "plan-version-2",
                    "run-resume-corrupt-run-json", "cli-plan-out-a-directory", "records-six-missing-columns"]


@pytest.mark.parametrize("case", [c for c in CASES if c.id in SUBPROCESS_CASES], ids=lambda c: c.id)
def test_bad_input_end_to_end(case: Case, tmp_path: Path) -> None:
    _write(tmp_path, case.files)
    args = [a.replace("{d}", str(tmp_path)) for a in case.args]
    env = {k: v for k, v in os.environ.items() if k != "WEAVE_DEBUG"} | case.env
    proc = subprocess.run([sys.executable, "-m", "weave_rl.cli.app", *args], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout
    check_error(proc.stderr, case)


def test_only_aliases_count_against_the_expansion_limit(monkeypatch) -> None:
    from weave_rl.core import yamlio
    from weave_rl.core.errors import InputError

    monkeypatch.setattr(yamlio, "MAX_NODES", 50)
    assert len(yamlio.parse_yaml("[" + ", ".join(["1"] * 200) + "]", "big.yaml")) == 200  # large, no alias
    with pytest.raises(InputError, match="big.yaml: YAML aliases expand to over 50 values"):
        yamlio.parse_yaml("a: &a [1, 2, 3, 4, 5, 6, 7, 8]\nb: [*a, *a, *a, *a, *a, *a, *a, *a]\n", "big.yaml")


def test_an_input_error_survives_pickling() -> None:
    """Worker processes and Ray actors send errors back pickled: every problem must arrive."""
    import pickle

    from weave_rl.core.errors import InputError

    error = InputError.many([("j.yaml", "jobs[0].gpus", "bad"), ("j.yaml", "jobs[1].name", "missing")])
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is InputError and back.problems == error.problems and str(back) == str(error)
    one = pickle.loads(pickle.dumps(InputError("a.yaml", "k", "r")))
    assert (one.file, one.key, one.reason, str(one)) == ("a.yaml", "k", "r", "a.yaml: k: r")


@pytest.mark.parametrize("args, text", [
    (["jobs", "generate", "micro", "-n", "1000000", "-o", "{d}/j.yaml"], "100000"),
    (["plan", "show", "{d}/p.yaml", "--cycles", "100000"], "1000"),
    (["plan", "-t", "weave-testbed", "-j", "{d}/j.yaml", "--threads", "100000"], "1024"),
])
def test_option_bounds_are_usage_errors(args, text, tmp_path, capsys) -> None:
    """Counts that would run for hours (a million jobs, 100000 Gantt cycles) are refused by the parser."""
    code = main([a.replace("{d}", str(tmp_path)) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "less than or equal to" in err and text in err, err


def test_resume_on_a_full_disk_says_so_before_anything_starts(tmp_path, capsys, monkeypatch) -> None:
    import json

    import weave_rl.core.yamlio as yamlio

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"plan": str(run / "plan.yaml"), "jobs": str(run / "jobs.yaml"),
                                              "topology": "local", "iterations": 3}))

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(yamlio.tempfile, "mkstemp", full)
    assert main(["run", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: <command line>: --resume: cannot write in folder {run}: no space left on device", err
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]


def test_hundreds_of_problems_are_all_listed_up_to_the_cap(tmp_path, capsys) -> None:
    from weave_rl.core.errors import MAX_SHOWN

    path = tmp_path / "j.yaml"
    path.write_text(jobs_yaml(*[job(name=f"J{i}", rollout__gpus=0) for i in range(MAX_SHOWN + 20)]))
    assert main(["jobs", "show", str(path)]) == 2
    lines = capsys.readouterr().err.rstrip("\n").split("\n")
    assert lines[0] == f"error: {path}: {MAX_SHOWN + 20} problems"
    assert lines[1].startswith("  jobs[0].rollout.gpus: Input should be greater than 0")
    assert lines[MAX_SHOWN].startswith(f"  jobs[{MAX_SHOWN - 1}].rollout.gpus: ")
    assert lines[-1] == "  ... and 20 more problems not shown" and len(lines) == MAX_SHOWN + 2


def test_atomic_write_names_a_full_disk_and_leaves_no_temporary_file(tmp_path, monkeypatch) -> None:
    """What executors need for checkpoints and shards: torch reports a full disk as
    ``RuntimeError: basic_ios::clear``; atomic_write asks the file system and says ENOSPC."""
    import shutil as shutil_module
    from collections import namedtuple

    import weave_rl.core.yamlio as yamlio

    def torch_like(tmp):
        tmp.write_bytes(b"half a checkpoint")
        raise RuntimeError("basic_ios::clear: iostream error")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda p: usage(10**9, 10**9, 0))
    with pytest.raises(OSError) as info:
        yamlio.atomic_write(tmp_path / "ckpt.pt", torch_like)
    assert info.value.errno == errno.ENOSPC and "ckpt.pt" in str(info.value)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(shutil_module, "disk_usage", lambda p: usage(10**9, 0, 10**9))
    with pytest.raises(RuntimeError, match="basic_ios"):  # not a full disk: the writer's own error
        yamlio.atomic_write(tmp_path / "ckpt.pt", torch_like)
    assert list(tmp_path.iterdir()) == []
    yamlio.atomic_write(tmp_path / "ckpt.pt", lambda tmp: tmp.write_bytes(b"ok"))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"] and (tmp_path / "ckpt.pt").read_bytes() == b"ok"
