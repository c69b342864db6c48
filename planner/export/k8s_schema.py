"""A schema check of the manifests ``weave_rl.planner.export.k8s`` writes: the fields Kubernetes requires of
an ``apps/v1`` Deployment or a ``batch/v1`` Job, and the GPU request rules, without a cluster.

``manifest_problems(doc)`` lists each problem as ``path: reason`` (empty when the manifest is fine).
Resource quantities must be strings (``"8"``): the OpenAPI schema has them as int-or-string, but the
official Python client's models (``V1ResourceRequirements``) take ``dict(str, str)`` and reject numbers.
"""

from __future__ import annotations

import re
from typing import Any

KINDS = {"Deployment": "apps/v1", "Job": "batch/v1"}
GPU = "nvidia.com/gpu"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def dns_label(text: str) -> str:
    """``A1_big.run`` -> ``a1-big-run``: a valid DNS-1123 label (lowercase, '-', <= 63 characters)."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (out[:63].rstrip("-")) or "x"


def label_name(text: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    return (out[:63].rstrip("-_.")) or "x"


def manifest_problems(doc: Any) -> list[str]:
    problems: list[str] = []

    def need(path: str, value: Any, kind: type | tuple, what: str) -> bool:
        if not isinstance(value, kind) or (isinstance(value, (str, list, dict)) and not value):
            problems.append(f"{path}: required {what}")
            return False
        return True

    if not need("<manifest>", doc, dict, "mapping"):
        return problems
    kind = doc.get("kind")
    if kind not in KINDS:
        problems.append(f"kind: expected one of {', '.join(KINDS)} (got {kind!r})")
    elif doc.get("apiVersion") != KINDS[kind]:
        problems.append(f"apiVersion: {kind} needs {KINDS[kind]} (got {doc.get('apiVersion')!r})")
    meta = doc.get("metadata")
    if need("metadata", meta, dict, "mapping"):
        name = meta.get("name")
        if need("metadata.name", name, str, "string") and (not _DNS_LABEL.match(name) or len(name) > 63):
            problems.append(f"metadata.name: not a DNS-1123 label of <= 63 characters (got {name!r})")
        _labels(meta.get("labels", {}), "metadata.labels", problems)
    spec = doc.get("spec")
    if not need("spec", spec, dict, "mapping"):
        return problems
    template = spec.get("template")
    if not need("spec.template", template, dict, "mapping"):
        return problems
    t_labels = (template.get("metadata") or {}).get("labels", {})
    _labels(t_labels, "spec.template.metadata.labels", problems)
    if kind == "Deployment":
        replicas = spec.get("replicas", 1)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            problems.append(f"spec.replicas: expected an integer >= 0 (got {replicas!r})")
        selector = (spec.get("selector") or {}).get("matchLabels")
        if need("spec.selector.matchLabels", selector, dict, "mapping"):
            for key, value in selector.items():
                if t_labels.get(key) != value:
                    problems.append(f"spec.selector.matchLabels.{key}: does not match spec.template.metadata.labels")
    pod = template.get("spec")
    if not need("spec.template.spec", pod, dict, "mapping"):
        return problems
    if kind == "Job" and pod.get("restartPolicy") not in ("Never", "OnFailure"):
        problems.append("spec.template.spec.restartPolicy: a Job needs Never or OnFailure")
    for key, value in (pod.get("nodeSelector") or {}).items():
        if not isinstance(value, str):
            problems.append(f"spec.template.spec.nodeSelector.{key}: expected a string")
    containers = pod.get("containers")
    if need("spec.template.spec.containers", containers, list, "non-empty list"):
        for i, c in enumerate(containers):
            _container(c, f"spec.template.spec.containers[{i}]", problems, need)
    return problems


def _container(c: Any, path: str, problems: list[str], need) -> None:
    if not need(path, c, dict, "mapping"):
        return
    if need(f"{path}.name", c.get("name"), str, "string") and not _DNS_LABEL.match(c["name"]):
        problems.append(f"{path}.name: not a DNS-1123 label (got {c['name']!r})")
    need(f"{path}.image", c.get("image"), str, "string")
    resources = c.get("resources")
    if not need(f"{path}.resources", resources, dict, "mapping"):
        return
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    gpu = limits.get(GPU)
    if isinstance(gpu, (int, float)) and not isinstance(gpu, bool):
        problems.append(f"{path}.resources.limits.{GPU}: a quantity is a string ({str(gpu)!r}, not {gpu!r}): the "
                        "Kubernetes Python client's models reject numbers")
    elif not isinstance(gpu, str) or not gpu.isdigit() or int(gpu) <= 0:
        problems.append(f"{path}.resources.limits.{GPU}: required positive whole-number quantity string "
                        f"such as '8' (got {gpu!r})")
    if GPU in requests and requests[GPU] != gpu:
        problems.append(f"{path}.resources.requests.{GPU}: must equal the limit for an extended resource")


def _labels(labels: Any, path: str, problems: list[str]) -> None:
    if not isinstance(labels, dict):
        problems.append(f"{path}: expected a mapping")
        return
    for key, value in labels.items():
        prefix, _, name = str(key).rpartition("/")
        if not _LABEL_NAME.match(name) or len(name) > 63 or (prefix and not _DNS_SUBDOMAIN.match(prefix)):
            problems.append(f"{path}: invalid label key {key!r}")
        if not isinstance(value, str) or (value and (len(value) > 63 or not _LABEL_NAME.match(value))):
            problems.append(f"{path}.{key}: invalid label value {value!r}")
