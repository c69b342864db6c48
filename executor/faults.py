"""Failure injection specs: ``NODE@T+D`` -- node NODE goes down at T seconds for D seconds.

Several faults are separated by commas: ``train-000@120+30,rollout-003@900+600``.
"""

from __future__ import annotations

from weave_rl.executor.sim import Fault
from weave_rl.topology.topology import Topology
from weave_rl.core.errors import InputError

SYNTAX = "NODE@T+D (node down at T seconds for D seconds), comma-separated"


def parse_faults(text: str | None, topology: Topology, source: str = "--fail") -> list[Fault]:
    faults: list[Fault] = []
    if not text:
        return faults
    for i, item in enumerate(p.strip() for p in text.split(",")):
        node, at, rest = item.partition("@")
        start, plus, length = rest.partition("+")
        try:
            at_s, for_s = float(start), float(length)
        except ValueError:
            raise InputError("<command line>", source, f"bad fault {item!r}: expected {SYNTAX}") from None
        if not node or not at or not plus or at_s < 0 or for_s <= 0:
            raise InputError("<command line>", source, f"bad fault {item!r}: expected {SYNTAX}, T >= 0, D > 0")
        if node not in topology.nodes:
            raise InputError("<command line>", source, f"unknown node {node!r} in topology {topology.name!r}")
        faults.append(Fault(node, at_s, for_s))
    return faults
