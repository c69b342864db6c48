"""The independent plan checker against hand-built plans on the weave-testbed preset.

The valid two-job plan (times from the shared PlanningModel, placed by hand):

    rollout-000 (H20):  A rollout [0, 100) | switch | B rollout [100 + sw_r, 150 + sw_r)
    train-000  (H800):  B train (wrapped tail) ... | switch | A train [100, 160) | switch | B train [160 + sw_t, ...)
    A: sync [160, 160 + S); cycle C = A's solo time = 100 + 60 + S, so A's next rollout starts at C (gap 0).
    B: train [160 + sw_t, 200 + sw_t) wraps past C; sync right after it; next rollout at 100 + sw_r + C.
"""

from __future__ import annotations

import pytest

from weave_rl.planner.check import (
    RULES,
    Violation,
    assert_valid,
    check_plan,
    circular_gap,
    circular_overlap,
    circular_segments,
    format_violations,
)
from weave_rl.planner.model import PlanningModel, ceil_ms
from weave_rl.planner.plan import GroupPlan, JobPlan, PhaseSlot, Plan, Rejection, SolverInfo, plan_from_data, plan_to_data
from weave_rl.profiles.jobs import jobs_from_data
from weave_rl.topology.topology import load_topology, topology_from_data, topology_to_data

R_NODE, T_NODE = "rollout-000", "train-000"
COST = 8 * 1.85 + 8 * 5.28  # 57.04


def gpus(node: str, n: int = 8) -> list[str]:
    return [f"{node}:{i}" for i in range(n)]


def job_data(name: str, rollout_s: float, train_s: float, **extra) -> dict:
    rollout = {"gpus": 8, "gpu_type": "H20", "duration_s": rollout_s, "host_mem_gb": 275.7,
               **extra.pop("rollout", {})}
    train = {"gpus": 8, "gpu_type": "H800", "duration_s": train_s, "host_mem_gb": 240.0,
             **extra.pop("train", {})}
    return {"name": name, "params_b": 7, "slo": 2.0, **extra, "rollout": rollout, "train": train}


def make_jobs(*jobs: dict):
    return jobs_from_data({"jobs": list(jobs)}, "jobs.yaml")


@pytest.fixture(scope="module")
def topo():
    return load_topology("weave-testbed")


@pytest.fixture(scope="module")
def jobs():
    return make_jobs(job_data("A", 100, 60), job_data("B", 50, 40))


@pytest.fixture(scope="module")
def model(topo, jobs):
    return PlanningModel(topo, jobs, 0.95)


def slot(phase: str, start: float, duration: float, node: str) -> PhaseSlot:
    return PhaseSlot(phase=phase, start_s=start, duration_s=duration, gpus=gpus(node))


def job_plan(name: str, solo: float, cycle: float, r: tuple, t: tuple, s: tuple,
             r_node: str = R_NODE, t_node: str = T_NODE) -> JobPlan:
    """r, t, s: (start, duration) of rollout, train and sync (sync targets the rollout GPUs)."""
    return JobPlan(name=name, solo_iteration_s=solo, iteration_s=cycle, phases=[
        slot("rollout", r[0] % cycle, r[1], r_node),
        slot("train", t[0] % cycle, t[1], t_node),
        slot("sync", s[0] % cycle, s[1], r_node),
    ])


def make_plan(groups: list[GroupPlan], cost: float = COST, **extra) -> Plan:
    return Plan(policy="optimal", quantile=0.95, topology="weave-testbed", cost_usd_per_hour=cost,
                solver=SolverInfo(name="hand", status="OPTIMAL"), groups=groups, **extra)


@pytest.fixture(scope="module")
def times(model, jobs):
    a, b = jobs["A"], jobs["B"]
    # Plans are written at millisecond resolution: the model's solo time rounds each phase up.
    sync = ceil_ms(model.sync_s(a, gpus(T_NODE), gpus(R_NODE)))
    assert sync == ceil_ms(model.sync_s(b, gpus(T_NODE), gpus(R_NODE)))
    sw_r = model.switch_s(b, "rollout", R_NODE)
    sw_t = model.switch_s(b, "train", T_NODE)
    cycle = model.solo["A"]
    assert cycle == pytest.approx(100 + 60 + sync)
    return {"sync": sync, "sw_r": sw_r, "sw_t": sw_t, "cycle": cycle,
            "solo_a": model.solo["A"], "solo_b": model.solo["B"]}


def pair_jobs(t, shift: float = 0.0, a: dict | None = None, b: dict | None = None) -> list[JobPlan]:
    """A and B of the valid timetable, every start moved by ``shift`` (mod the cycle); a/b override phases."""
    c, s = t["cycle"], t["sync"]
    b_r = 100 + t["sw_r"]
    b_t = 160 + t["sw_t"]
    phases_a = {"r": (0.0, 100.0), "t": (100.0, 60.0), "s": (160.0, s), **(a or {})}
    phases_b = {"r": (b_r, 50.0), "t": (b_t, 40.0), "s": (b_t + 40, s), **(b or {})}
    out = []
    for name, ph, solo in (("A", phases_a, t["solo_a"]), ("B", phases_b, t["solo_b"])):
        out.append(job_plan(name, solo, c, *[(ph[k][0] + shift, ph[k][1]) for k in "rts"]))
    return out


def pair_plan(t, shift: float = 0.0, a: dict | None = None, b: dict | None = None, **extra) -> Plan:
    group = GroupPlan(name="g0", cycle_s=t["cycle"], nodes=[R_NODE, T_NODE], jobs=pair_jobs(t, shift, a, b),
                      usd_per_hour=COST)
    return make_plan([group], **extra)


def rules(violations: list[Violation]) -> set[str]:
    return {v.rule for v in violations}


def with_group(plan: Plan, **update) -> Plan:
    return plan.model_copy(update={"groups": [plan.groups[0].model_copy(update=update)]})


def with_job(plan: Plan, name: str, **update) -> Plan:
    jobs = [j.model_copy(update=update) if j.name == name else j for j in plan.groups[0].jobs]
    return with_group(plan, jobs=jobs)


def with_phase(plan: Plan, name: str, phase: str, **update) -> Plan:
    job = next(j for j in plan.groups[0].jobs if j.name == name)
    phases = [p.model_copy(update=update) if p.phase == phase else p for p in job.phases]
    return with_job(plan, name, phases=phases)


# ----- valid plans ---------------------------------------------------------------------------------


def test_two_job_plan_is_valid(topo, jobs, times):
    plan = pair_plan(times)
    assert check_plan(plan, topo, jobs) == []
    assert_valid(plan, topo, jobs)
    assert times["cycle"] <= 2.0 * times["solo_b"]  # B's SLO holds
    # A YAML round trip keeps it valid.
    assert check_plan(plan_from_data(plan_to_data(plan)), topo, jobs) == []


@pytest.mark.parametrize("shift", [30.0, 120.0, 150.5])
def test_rotated_plan_stays_valid(topo, jobs, times, shift):
    # Rotating every start around the circle makes phases wrap past the cycle's end; still valid.
    assert check_plan(pair_plan(times, shift=shift), topo, jobs) == []


def test_solo_single_job_plan_is_valid(topo, model):
    jobs = make_jobs(job_data("A", 100, 60))
    a = jobs["A"]
    r = ceil_ms(model.duration(a, "rollout", 8, "H20"))
    t = ceil_ms(model.duration(a, "train", 8, "H800"))
    s = ceil_ms(model.sync_s(a, gpus(T_NODE), gpus(R_NODE)))
    solo = r + t + s
    assert solo == pytest.approx(PlanningModel(topo, jobs).solo["A"])
    group = GroupPlan(name="solo-A", cycle_s=solo, nodes=[R_NODE, T_NODE],
                      jobs=[job_plan("A", solo, solo, (0, r), (r, t), (r + t, s))])
    assert check_plan(make_plan([group]), topo, jobs) == []


def test_all_rejected_plan_is_valid(topo, jobs):
    plan = make_plan([], cost=0.0, rejected=[Rejection(name="A", reason="no room"),
                                             Rejection(name="B", reason="no room")])
    assert check_plan(plan, topo, jobs) == []


def test_staleness_one_loop_over_two_cycles(topo):
    def jobs_with(staleness):
        return make_jobs(job_data("S", 100, 60, max_staleness=staleness))

    jobs = jobs_with(1)
    m = PlanningModel(topo, jobs)
    s = m.sync_s(jobs["S"], gpus(T_NODE), gpus(R_NODE))
    cycle = 110.0  # rollout back to back; train and sync of iteration i overlap rollout i + 1
    group = GroupPlan(name="g0", cycle_s=cycle, nodes=[R_NODE, T_NODE],
                      jobs=[job_plan("S", m.solo["S"], cycle, (0, 100), (100, 60), (160, s))])
    plan = make_plan([group])
    assert check_plan(plan, topo, jobs) == []
    found = check_plan(plan, topo, jobs_with(0))
    assert rules(found) == {"chain"}
    assert "spans 2 cycles" in found[0].message


# ----- one mutation per rule -----------------------------------------------------------------------


def test_overlap_rollout_on_same_time(topo, jobs, times):
    found = check_plan(pair_plan(times, b={"r": (45.0, 50.0)}), topo, jobs)  # after its sync (ends ~41)
    assert rules(found) == {"overlap"}
    assert "job A / rollout ~ job B / rollout" in found[0].where
    assert "8 GPU(s)" in found[0].message


def test_overlap_wraps_around_the_cycle(topo, jobs, times):
    # Shifted by 120 s, A's rollout [120, 220) wraps to [0, 220 - C); B's rollout put at 30 lands in
    # that wrapped tail (it would not collide with [120, 220) taken literally). Its chain still spans one cycle.
    shift = 120.0
    plan = pair_plan(times, shift=shift, b={"r": (30.0 - shift, 50.0)})
    assert plan.groups[0].jobs[1].phase("rollout").start_s == pytest.approx(30.0)
    found = check_plan(plan, topo, jobs)
    assert rules(found) == {"overlap"}
    assert "job A / rollout ~ job B / rollout" in found[0].where


def test_overlap_of_warm_switch_gap(topo, jobs, times):
    # B's rollout starts exactly when A's ends: no plain overlap, but B's warm switch does not fit.
    found = check_plan(pair_plan(times, b={"r": (100.0, 50.0)}), topo, jobs)
    assert rules(found) == {"overlap"}
    assert "warm-switch" in found[0].message


def test_chain_train_before_rollout_end(topo, jobs, times):
    found = check_plan(pair_plan(times, a={"t": (50.0, 60.0)}), topo, jobs)
    assert rules(found) == {"chain"}
    assert found[0].where == "group g0 / job A"


def test_duration_too_short(topo, jobs, times):
    found = check_plan(pair_plan(times, a={"t": (100.0, 59.0)}), topo, jobs)
    assert rules(found) == {"duration"}
    assert found[0].where == "group g0 / job A / train"


def test_sync_too_short_and_wrong_targets(topo, jobs, times):
    plan = pair_plan(times, a={"s": (160.0, 1.0)})
    found = check_plan(plan, topo, jobs)
    assert rules(found) == {"duration"}
    assert "sync" in found[0].where
    plan = with_phase(pair_plan(times), "A", "sync", gpus=gpus(R_NODE, 4))
    assert rules(check_plan(plan, topo, jobs)) == {"duration"}


def test_memory_of_a_small_node(jobs, times):
    data = topology_to_data(load_topology("weave-testbed"))
    data["clusters"][0]["host_mem_gb"] = 500  # rollout nodes; A and B roll out there: 2 x 275.7
    small = topology_from_data(data, "small.yaml")
    found = check_plan(pair_plan(times), small, jobs)
    assert rules(found) == {"memory"}
    assert found[0].where == "node rollout-000"
    assert "551.4" in found[0].message


def test_cost_wrong(topo, jobs, times):
    assert rules(check_plan(pair_plan(times, cost=60.0), topo, jobs)) == {"cost"}
    assert rules(check_plan(with_group(pair_plan(times), usd_per_hour=50.0), topo, jobs)) == {"cost"}
    plan = pair_plan(times, lower_bound_usd_per_hour=58.0)
    assert rules(check_plan(plan, topo, jobs)) == {"cost"}
    assert check_plan(pair_plan(times, lower_bound_usd_per_hour=COST), topo, jobs) == []


def test_job_missing(topo, jobs, times):
    plan = with_group(pair_plan(times), jobs=pair_jobs(times)[:1])
    found = check_plan(plan, topo, jobs)
    assert rules(found) == {"placement"}
    assert found[0].where == "job B"


def test_job_twice(topo, jobs, times):
    plan = pair_plan(times, rejected=[Rejection(name="B", reason="too big")])
    found = check_plan(plan, topo, jobs)
    assert rules(found) == {"placement"}
    assert "both placed" in found[0].message
    plan = make_plan([], cost=0.0, rejected=[Rejection(name="A", reason="x"), Rejection(name="A", reason="y"),
                                             Rejection(name="B", reason=" ")])
    messages = [v.message for v in check_plan(plan, topo, jobs)]
    assert any("rejected 2 times" in m for m in messages)
    assert any("no reason" in m for m in messages)


def test_job_twice_in_two_groups_and_unknown_job(topo, jobs, times):
    a, b = pair_jobs(times)
    c = times["cycle"]
    g0 = GroupPlan(name="g0", cycle_s=c, nodes=[R_NODE, T_NODE], jobs=[a, b])
    b2 = job_plan("B", times["solo_b"], c, (0, 50), (50, 40), (90, times["sync"]), "rollout-001", "train-001")
    g1 = GroupPlan(name="g1", cycle_s=c, nodes=["rollout-001", "train-001"], jobs=[b2])
    found = check_plan(make_plan([g0, g1], cost=2 * COST), topo, jobs)
    assert rules(found) == {"placement"}
    assert "placed 2 times" in found[0].message
    ghost = b2.model_copy(update={"name": "Z"})
    g1 = g1.model_copy(update={"jobs": [ghost]})
    found = check_plan(make_plan([g0, g1], cost=2 * COST), topo, jobs)
    assert rules(found) == {"placement"}
    assert "not in the jobs file" in found[0].message


def test_gpu_on_a_node_outside_the_group(topo, jobs, times):
    plan = with_phase(pair_plan(times), "A", "train", gpus=gpus("train-001"))
    found = check_plan(plan, topo, jobs)
    assert rules(found) == {"nodes"}
    assert "train-001" in found[0].message


def test_nodes_disjoint_unknown_and_duplicate_gpus(topo, jobs, times):
    a, b = pair_jobs(times)
    c = times["cycle"]
    g0 = GroupPlan(name="g0", cycle_s=c, nodes=[R_NODE, T_NODE], jobs=[a])
    g1 = GroupPlan(name="g1", cycle_s=c, nodes=[R_NODE, T_NODE], jobs=[b])
    found = check_plan(make_plan([g0, g1], cost=2 * COST), topo, jobs)
    assert "nodes" in rules(found)
    assert any("in two groups" in v.message for v in found)

    plan = with_phase(pair_plan(times), "A", "train", gpus=gpus(T_NODE, 7) + [f"{T_NODE}:0"])
    assert "nodes" in rules(check_plan(plan, topo, jobs))
    plan = with_phase(pair_plan(times), "A", "train", gpus=gpus(T_NODE, 7) + [f"{T_NODE}:8"])
    assert "nodes" in rules(check_plan(plan, topo, jobs))
    plan = with_group(pair_plan(times), nodes=[R_NODE, T_NODE, "train-999"])
    assert "nodes" in rules(check_plan(plan, topo, jobs))


def test_phase_rules(topo, times):
    # Counts and types the jobs file does not allow; the durations themselves stay fine.
    jobs = make_jobs(job_data("A", 100, 60, rollout={"gpu_options": [4]}, train={"gpu_types": ["H20"]}),
                     job_data("B", 50, 40))
    found = check_plan(pair_plan(times), topo, jobs)
    assert rules(found) == {"phases"}
    assert {v.where for v in found} == {"group g0 / job A / rollout", "group g0 / job A / train"}

    jobs = make_jobs(job_data("A", 100, 60), job_data("B", 50, 40))
    plan = with_phase(pair_plan(times), "A", "rollout", start_s=times["cycle"])  # same instant mod C
    assert rules(check_plan(plan, topo, jobs)) == {"phases"}
    plan = with_job(pair_plan(times), "A", phases=pair_jobs(times)[0].phases[:2])  # no sync
    assert rules(check_plan(plan, topo, jobs)) == {"phases"}
    plan = with_phase(pair_plan(times), "A", "train", gpus=gpus(T_NODE, 4) + [f"{R_NODE}:{i}" for i in range(4)])
    assert "phases" in rules(check_plan(plan, topo, jobs))


def test_slo_exceeded(topo, times):
    jobs = make_jobs(job_data("A", 100, 60), job_data("B", 50, 40, slo=1.5))
    found = check_plan(pair_plan(times), topo, jobs)
    assert rules(found) == {"iteration"}
    assert found[0].where == "group g0 / job B"


def test_iteration_and_solo_values(topo, jobs, times):
    found = check_plan(with_job(pair_plan(times), "B", solo_iteration_s=80.0), topo, jobs)
    assert rules(found) == {"iteration"}
    assert repr(times["solo_b"]) in found[0].message
    assert rules(check_plan(with_job(pair_plan(times), "A", iteration_s=150.0), topo, jobs)) == {"iteration"}


def test_topology_name(topo, jobs, times):
    plan = pair_plan(times).model_copy(update={"topology": "a100-32"})
    assert rules(check_plan(plan, topo, jobs)) == {"topology"}


def test_every_violation_is_listed_and_formatted(topo, jobs, times):
    plan = pair_plan(times, cost=1.0, a={"t": (50.0, 59.0)}, b={"r": (0.0, 50.0)})
    plan = plan.model_copy(update={"topology": "elsewhere"})
    found = check_plan(plan, topo, jobs)
    assert {"cost", "chain", "duration", "overlap", "topology"} <= rules(found)
    assert rules(found) <= set(RULES)
    text = format_violations(found)
    assert len(text.splitlines()) == len(found)
    with pytest.raises(AssertionError, match="plan violation"):
        assert_valid(plan, topo, jobs)


def test_checker_imports_no_solver():
    import subprocess
    import sys

    code = ("import sys, weave_rl.planner.check; "
            "bad = [m for m in sys.modules if m in ('weave_rl.planner.optimal', 'weave_rl.planner.timetable', "
            "'weave_rl.planner.baselines', 'weave_rl.planner.optimize') or m.startswith('ortools')]; "
            "print(bad); assert not bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----- circle arithmetic ---------------------------------------------------------------------------


def test_circular_helpers():
    assert circular_segments(90, 20, 100) == [(90, 100), (0, 10)]
    assert circular_segments(-5, 10, 100) == [(95, 100), (0, 5)]
    assert circular_segments(10, 100, 100) == [(0, 100)]
    assert circular_overlap((90, 20), (5, 10), 100) == pytest.approx(5)
    assert circular_overlap((90, 10), (0, 10), 100) == 0  # touching at the wrap point
    assert circular_overlap((0, 50), (50, 50), 100) == 0
    assert circular_gap(100.0, 0.0, 100.0) == 0.0
    c = 165.633
    assert circular_gap(160 + 5.633, 0.0, c) == 0.0
    assert circular_gap(1e-12, 0.0, c) == 0.0  # round-off past the start: 0, not a whole cycle
    assert circular_gap(c - 1e-12, 0.0, c) == pytest.approx(1e-12)
    assert circular_gap(10, 5, 100) == 95
