"""A plan kept live while jobs arrive and leave: what the greedy policies and admission place around.

``LivePlan`` holds the groups (members with their GPUs, nodes and timetable), the free nodes of each
cluster (``NodeAllocator``: handed out in id order and given back in it, so that plans are
reproducible), the host memory pinned per node (``HostMemory``: a node holds the state of every
phase that runs there, so that switches stay warm) and the rejections. A group opens with its first
member and grows by ``join``; ``release`` takes a member out, and the nodes nobody in its group uses
any more go back to the free pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from weave_rl.core.errors import InputError
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.plan import GroupPlan, Plan, Rejection
from weave_rl.planner.roundrobin import Member, PhaseTime, group_plan, round_robin_timetable
from weave_rl.planner.rules import fits_memory, meets_slo, member_cap
from weave_rl.profiles.jobs import JobSpec
from weave_rl.topology.topology import Topology, node_of

Phases = dict[str, dict[str, PhaseTime]]  # job -> phase -> (start, duration)


class NodeAllocator:
    """Whole free nodes of each cluster, handed out in id order and never twice."""

    def __init__(self, topology: Topology, reserved: Iterable[str] = ()):
        self.topology = topology
        self._free = {name: [n.id for n in topology.nodes_in(cluster=name)] for name in topology.clusters}
        self._order = {node_id: i for nodes in self._free.values() for i, node_id in enumerate(nodes)}
        self.take(reserved)

    def free(self, cluster: str) -> int:
        return len(self._free[cluster])

    def peek(self, cluster: str, count: int, skip: int = 0) -> list[str] | None:
        """The next ``count`` free nodes after ``skip`` of them, or None when there are too few."""
        nodes = self._free[cluster][skip:skip + count]
        return nodes if len(nodes) == count else None

    def claim(self, cluster: str, count: int) -> list[str]:
        """The next ``count`` free nodes, taken."""
        nodes = self.peek(cluster, count)
        if nodes is None:
            raise RuntimeError(f"cluster {cluster} has no {count} free nodes left")
        self.take(nodes)
        return nodes

    def take(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            self._free[self.topology.node(node).cluster].remove(node)

    def give(self, nodes: Iterable[str]) -> None:
        """Return taken nodes, back in id order."""
        for node in nodes:
            free = self._free[self.topology.node(node).cluster]
            free.append(node)
            free.sort(key=self._order.__getitem__)


class HostMemory:
    """Host memory pinned on each node, per (job, phase)."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.used: dict[str, dict[tuple[str, str], float]] = {}

    @staticmethod
    def pins(member: Member) -> dict[str, dict[tuple[str, str], float]]:
        out: dict[str, dict[tuple[str, str], float]] = {}
        for kind in ("rollout", "train"):
            for node in {node_of(g) for g in member.gpus(kind)}:
                out.setdefault(node, {})[(member.job.name, kind)] = member.job.phase(kind).host_mem_gb
        return out

    def gb(self, node: str) -> float:
        return sum(self.used.get(node, {}).values())

    def overflow(self, member: Member) -> str | None:
        """Why the member's state does not fit beside what is pinned (None: it fits)."""
        for node, pins in self.pins(member).items():
            total = sum({**self.used.get(node, {}), **pins}.values())
            cap = self.topology.node(node).host_mem_gb
            if not fits_memory(total, cap):
                return f"host memory of {node} would hold {total:.1f} GB, more than its {cap:g} GB"
        return None

    def add(self, member: Member) -> None:
        for node, pins in self.pins(member).items():
            self.used.setdefault(node, {}).update(pins)

    def remove(self, member: Member) -> None:
        for node, pins in self.pins(member).items():
            for key in pins:
                self.used[node].pop(key, None)


@dataclass
class LiveGroup:
    name: str
    members: list[Member]
    nodes: list[str]
    cycle_s: float
    phases: Phases
    plan: GroupPlan | None = None  # laid out when asked for, until the group changes

    @property
    def train_gpus(self) -> tuple[str, ...]:
        return self.members[0].train_gpus

    @property
    def rollout_nodes(self) -> list[str]:
        """Nodes holding its rollouts, in the order members took them."""
        return list(dict.fromkeys(node_of(g) for m in self.members for g in m.rollout_gpus))


class LivePlan:
    def __init__(self, model: PlanningModel):
        self.model = model
        self.topology = model.topology
        self.alloc = NodeAllocator(model.topology)
        self.memory = HostMemory(model.topology)
        self.groups: dict[str, LiveGroup] = {}
        self.rejected: list[Rejection] = []
        self._made = 0  # groups opened: names stay unique when groups empty
        self._where: dict[str, str] = {}  # job -> its group's name

    def load(self, plan: Plan, specs: Mapping[str, JobSpec], source: str = "<plan>") -> None:
        """Hold the groups of a plan in force (their timetables as planned), its nodes taken."""
        for g in plan.groups:
            members = []
            for jp in g.jobs:
                if jp.name not in specs:
                    raise InputError(source, f"groups.{g.name}.jobs.{jp.name}", "job is not in the jobs file")
                members.append(Member(specs[jp.name], tuple(jp.phase("rollout").gpus), tuple(jp.phase("train").gpus)))
            phases = {jp.name: {s.phase: PhaseTime(s.start_s, s.duration_s) for s in jp.phases} for jp in g.jobs}
            self.alloc.take(g.nodes)
            self._add(LiveGroup(g.name, [], list(g.nodes), g.cycle_s, phases, plan=g), members)
        self.rejected = list(plan.rejected)

    def open(self, member: Member, nodes: list[str], cycle_s: float, phases: Phases) -> LiveGroup:
        """A new group of ``member`` alone on the free ``nodes``."""
        while f"g{self._made}" in self.groups:
            self._made += 1
        self.alloc.take(nodes)
        group = self._add(LiveGroup(f"g{self._made}", [], list(nodes), cycle_s, phases), [member])
        self._made += 1
        return group

    def join(self, group: LiveGroup, member: Member, nodes: list[str], cycle_s: float, phases: Phases) -> None:
        """``member`` joins ``group``, adding the free ``nodes``, under the new timetable."""
        self.alloc.take(nodes)
        group.nodes += nodes
        group.cycle_s, group.phases, group.plan = cycle_s, phases, None
        self._add(group, [member])

    def _add(self, group: LiveGroup, members: list[Member]) -> LiveGroup:
        self.groups[group.name] = group
        for m in members:
            group.members.append(m)
            self.memory.add(m)
            self._where[m.job.name] = group.name
        return group

    def group_of(self, name: str) -> LiveGroup | None:
        return self.groups.get(self._where.get(name, ""))

    def release(self, name: str) -> LiveGroup | None:
        """Take job ``name`` out of its group (KeyError when it is in none). The group keeps its
        timetable less the leaver's phases unless the round robin of the rest is shorter within
        every cap. Returns the group, or None when it emptied."""
        group = self.group_of(name)
        if group is None:
            raise KeyError(f"job {name} is not in the plan")
        member = next(m for m in group.members if m.job.name == name)
        self.memory.remove(member)
        group.members.remove(member)
        del self._where[name]
        used = {node_of(g) for m in group.members for g in (*m.rollout_gpus, *m.train_gpus)}
        self.alloc.give([n for n in group.nodes if n not in used])
        if not group.members:
            del self.groups[group.name]
            return None
        group.nodes = [n for n in group.nodes if n in used]
        group.phases = {k: v for k, v in group.phases.items() if k != name}
        rr = round_robin_timetable(self.model, group.members)
        if rr.cycle_s < group.cycle_s and all(meets_slo(rr.cycle_s, member_cap(self.model, m.job))
                                              for m in group.members):
            group.cycle_s, group.phases = rr.cycle_s, rr.phases
        group.plan = None
        return group

    def group_plans(self) -> list[GroupPlan]:
        for g in self.groups.values():
            if g.plan is None:
                g.plan = group_plan(self.topology, g.name, g.members, g.phases, g.cycle_s, g.nodes,
                                    self.model.solo_of)
        return [g.plan for g in self.groups.values()]
