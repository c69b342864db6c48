"""The manifest schema check: a good Deployment passes; each missing or wrong required field is named."""

import copy

import pytest

from weave_rl.planner.export.k8s_schema import dns_label, label_name, manifest_problems

GOOD = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "weave-p-g0-rollout", "labels": {"weave.io/group": "g0"}},
    "spec": {
        "replicas": 2,
        "selector": {"matchLabels": {"weave.io/group": "g0"}},
        "template": {
            "metadata": {"labels": {"weave.io/group": "g0", "job.weave.io/A1": "rollout"}},
            "spec": {"nodeSelector": {"pool": "rollout"},
                     "containers": [{"name": "worker", "image": "img:1",
                                     "resources": {"requests": {"nvidia.com/gpu": "8"},
                                                   "limits": {"nvidia.com/gpu": "8"}}}]},
        },
    },
}


def broken(path: str, value=None, delete: bool = False) -> dict:
    doc = copy.deepcopy(GOOD)
    *parents, leaf = path.split(".")
    node = doc
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if delete:
        del node[leaf]
    else:
        node[leaf] = value
    return doc


def test_good_manifest_and_job_pass():
    assert manifest_problems(GOOD) == []
    job = copy.deepcopy(GOOD)
    job.update(apiVersion="batch/v1", kind="Job")
    del job["spec"]["replicas"], job["spec"]["selector"]
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    assert manifest_problems(job) == []


@pytest.mark.parametrize("doc, expected", [
    (broken("apiVersion", "v1"), "apiVersion: Deployment needs apps/v1 (got 'v1')"),
    (broken("kind", "Pod"), "kind: expected one of Deployment, Job (got 'Pod')"),
    (broken("metadata.name", delete=True), "metadata.name: required string"),
    (broken("metadata.name", "Weave_G0"), "metadata.name: not a DNS-1123 label of <= 63 characters (got 'Weave_G0')"),
    (broken("metadata.name", "a" * 64), "metadata.name: not a DNS-1123 label of <= 63 characters"),
    (broken("spec.replicas", -1), "spec.replicas: expected an integer >= 0 (got -1)"),
    (broken("spec.selector.matchLabels", {"weave.io/group": "g1"}),
     "spec.selector.matchLabels.weave.io/group: does not match spec.template.metadata.labels"),
    (broken("spec.template.spec.containers", []), "spec.template.spec.containers: required non-empty list"),
    (broken("spec.template.spec.containers.0.image", delete=True), "spec.template.spec.containers[0].image: required string"),
    (broken("spec.template.spec.containers.0.resources", delete=True),
     "spec.template.spec.containers[0].resources: required mapping"),
    (broken("spec.template.spec.containers.0.resources.limits", {}),
     "spec.template.spec.containers[0].resources.limits.nvidia.com/gpu: required positive whole-number quantity "
     "string such as '8' (got None)"),
    (broken("spec.template.spec.containers.0.resources.limits", {"nvidia.com/gpu": 8}),
     "spec.template.spec.containers[0].resources.limits.nvidia.com/gpu: a quantity is a string ('8', not 8)"),
    (broken("spec.template.spec.containers.0.resources.limits", {"nvidia.com/gpu": "0"}),
     "spec.template.spec.containers[0].resources.limits.nvidia.com/gpu: required positive whole-number"),
    (broken("spec.template.spec.containers.0.resources.requests", {"nvidia.com/gpu": "4"}),
     "spec.template.spec.containers[0].resources.requests.nvidia.com/gpu: must equal the limit"),
    (broken("spec.template.metadata.labels", {"weave.io/group": "g0", "job.weave.io/A 1": "x"}),
     "spec.template.metadata.labels: invalid label key 'job.weave.io/A 1'"),
    (broken("spec.template.spec.nodeSelector", {"pool": 3}), "spec.template.spec.nodeSelector.pool: expected a string"),
])
def test_each_problem_is_named(doc, expected):
    problems = manifest_problems(doc)
    assert any(p.startswith(expected) for p in problems), problems


def test_job_needs_a_restart_policy():
    job = copy.deepcopy(GOOD)
    job.update(apiVersion="batch/v1", kind="Job")
    assert "spec.template.spec.restartPolicy: a Job needs Never or OnFailure" in manifest_problems(job)


def test_name_sanitizers():
    assert dns_label("Mixed_000.Run") == "mixed-000-run"
    assert len(dns_label("x" * 100)) == 63
    assert label_name("seed 0/a") == "seed-0-a"
