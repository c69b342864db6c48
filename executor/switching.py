"""Which jobs a plan change touches: pure functions on two plans' ``{job: (group, job plan)}`` maps.

- A job is *changed* when it appears, disappears, or its group's cycle or its own slots (offsets,
  durations, GPUs) differ; a finished job that leaves the plan is not a change.
- A new job *joins hot* when every other member of its new group is unchanged and keeps the same
  cycle, and no changed job still holds one of its GPUs in the old plan: it slots into the group's
  next cycle without disturbing anyone. (On GPUs a moved job drains from, it would queue between that
  job's last phases, and the switch of everything that job's old and new groups touch would wait
  for its phases as well.)
- The *closure* of the other changes: every job sharing an old or a new group with a changed job,
  repeated until stable. These groups drain to their cycle boundary before the switch.
"""

from __future__ import annotations

from typing import Callable, Mapping

from weave_rl.planner.plan import GroupPlan, JobPlan

Placement = tuple[GroupPlan, JobPlan]


def changed(a: Placement | None, b: Placement | None) -> bool:
    if a is None or b is None:
        return True
    (ga, ja), (gb, jb) = a, b
    if abs(ga.cycle_s - gb.cycle_s) > 1e-9:
        return True
    return _slots(ja) != _slots(jb)


def _slots(job: JobPlan) -> list[tuple]:
    return [(s.phase, s.start_s, s.duration_s, tuple(s.gpus)) for s in job.phases]


def changed_jobs(old: Mapping[str, Placement], new: Mapping[str, Placement],
                 finished: Callable[[str], bool]) -> set[str]:
    return {j for j in set(old) | set(new)
            if changed(old.get(j), new.get(j)) and not (j not in new and finished(j))}


def hot_joins(changes: set[str], old: Mapping[str, Placement], new: Mapping[str, Placement]) -> set[str]:
    draining = {g for j in changes if j in old for s in old[j][1].phases for g in s.gpus}
    hot = set()
    for j in changes - set(old):
        group = new[j][0]
        others = [x.name for x in group.jobs if x.name != j]
        if all(o in old and not changed(old[o], new[o]) and old[o][0].cycle_s == group.cycle_s for o in others) \
                and draining.isdisjoint(g for s in new[j][1].phases for g in s.gpus):
            hot.add(j)
    return hot


def closure(seed: set[str], old: Mapping[str, Placement], new: Mapping[str, Placement]) -> set[str]:
    out = set(seed)
    while True:
        groups_old = {old[j][0].name for j in out if j in old}
        groups_new = {new[j][0].name for j in out if j in new}
        more = {j for j, (g, _) in old.items() if g.name in groups_old} | \
               {j for j, (g, _) in new.items() if g.name in groups_new}
        if more <= out:
            return out
        out |= more
