"""The online API: admission without moving placed jobs, release, replan with migration charges.

Prices on weave-testbed: a training node (8 H800) is 42.24 $/h, a rollout node (8 H20) 14.80 $/h.
"""

from __future__ import annotations

import pytest

from weave_rl.planner.api import make_plan
from weave_rl.planner.check import assert_valid, check_plan
from weave_rl.planner.online import OnlinePlanner, replan
from weave_rl.planner.plan import Plan
from weave_rl.profiles.generators import generate
from weave_rl.profiles.jobs import JobSet, jobs_from_data, jobs_to_data
from weave_rl.topology.topology import load_topology

TESTBED = load_topology("weave-testbed")
TRAIN, ROLLOUT = 8 * 5.28, 8 * 1.85


def job(name, rollout, train, slo=2.0):
    return {"name": name, "params_b": 7, "slo": slo,
            "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": rollout, "host_mem_gb": 275.7},
            "train": {"gpus": 8, "gpu_type": "H800", "duration_s": train, "host_mem_gb": 240}}


def jobset(*specs):
    return jobs_from_data({"jobs": list(specs)}, "jobs.yaml")


def valid(plan: Plan, jobs: JobSet) -> Plan:
    plan = Plan.model_validate(plan.model_dump())  # the online plan is assembled without validation
    assert_valid(plan, TESTBED, jobs)
    return plan


def placement(plan: Plan) -> dict[str, tuple]:
    return {jp.name: tuple(tuple(s.gpus) for s in jp.phases) for g in plan.groups for jp in g.jobs}


def test_first_job_gets_a_group_of_its_own():
    jobs = jobset(job("A", 100, 60))
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]))
    adm = op.admit(jobs["A"])
    assert adm.placed and adm.group == "g0"
    assert adm.added_usd_per_hour == pytest.approx(TRAIN + ROLLOUT)
    valid(adm.plan, jobs)


def test_a_job_that_fits_the_bubbles_joins_for_free():
    # B's rollout (50 s) fits in A's training (60 s), B's training (40 s) in A's rollout (100 s).
    jobs = jobset(job("A", 100, 60), job("B", 50, 40))
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]))
    op.admit(jobs["A"])
    adm = op.admit(jobs["B"])
    assert adm.placed and adm.group == "g0" and adm.added_usd_per_hour == 0
    plan = valid(adm.plan, jobs)
    assert plan.cost_usd_per_hour == pytest.approx(TRAIN + ROLLOUT)


def test_admission_never_moves_placed_jobs():
    jobs = generate("Mixed", 30, 11)
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]))
    before: dict = {}
    for spec in jobs.jobs:
        op.admit(spec)
        now = placement(op.plan)
        assert all(now[name] == gpus for name, gpus in before.items())
        before = now
    valid(op.plan, jobs)


def test_tight_slo_opens_a_new_group_with_the_reason_for_others():
    jobs = jobset(job("A", 100, 60), job("B", 50, 40, slo=1.2))
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]))
    op.admit(jobs["A"])
    adm = op.admit(jobs["B"])
    assert adm.placed and adm.group == "g1"
    assert adm.added_usd_per_hour == pytest.approx(TRAIN + ROLLOUT)


def test_rejection_names_the_reason():
    jobs = jobset(job("A", 100, 60, slo=0.9))
    adm = OnlinePlanner(TESTBED, JobSet(jobs=[])).admit(jobs["A"])
    assert not adm.placed and "SLO 0.9 < 1" in adm.reason
    assert [r.name for r in adm.plan.rejected] == ["A"]


def test_full_topology_rejects_with_no_free_nodes():
    tiny = load_topology("a100-32")
    jobs = generate("seed", 3, 0)
    op = OnlinePlanner(tiny, JobSet(jobs=[]))
    results = [op.admit(j) for j in jobs.jobs]
    assert results[0].placed
    assert not results[-1].placed and "free" in results[-1].reason


def test_release_frees_the_last_jobs_nodes_and_shrinks_groups():
    jobs = jobset(job("A", 100, 60), job("B", 50, 40))
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]))
    op.admit(jobs["A"])
    op.admit(jobs["B"])
    plan = op.release("A")
    assert [jp.name for g in plan.groups for jp in g.jobs] == ["B"]
    valid(plan, jobset(job("B", 50, 40)))
    plan = op.release("B")
    assert plan.groups == [] and plan.cost_usd_per_hour == 0
    assert op.admit(jobs["A"]).group == "g1"  # nodes came back to the pool


def test_admit_after_release_reuses_the_room():
    jobs = generate("Mixed", 20, 5)
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]))
    for spec in jobs.jobs:
        op.admit(spec)
    cost = op.plan.cost_usd_per_hour
    gone = jobs.jobs[3]
    op.release(gone.name)
    adm = op.admit(gone)
    assert adm.placed
    valid(adm.plan, jobs)
    assert adm.plan.cost_usd_per_hour <= cost + 1e-6


def test_admission_on_a_saved_plan_keeps_every_placed_job_where_it_is():
    jobs = generate("Mixed", 10, 2)
    base = make_plan(TESTBED, JobSet(jobs=jobs.jobs[:9]), time_limit_s=20)
    op = OnlinePlanner(TESTBED, jobs, base)
    adm = op.admit(jobs.jobs[9])
    assert adm.placed
    assert all(placement(adm.plan)[n] == g for n, g in placement(base).items())
    valid(adm.plan, jobs)
    smaller = op.release(jobs.jobs[0].name)
    assert jobs.jobs[0].name not in smaller.jobs


def test_replan_keeps_everything_when_moving_does_not_pay():
    jobs = generate("Mixed", 12, 6)
    base = make_plan(TESTBED, jobs, time_limit_s=20)
    result = replan(base, jobs, TESTBED, migration_cost_s=1e7, time_limit_s=20)
    assert result.moved == []
    assert result.cost_after <= result.cost_before + 1e-6
    assert not check_plan(result.plan, TESTBED, jobs)


def test_replan_after_drift_moves_jobs_only_for_savings():
    jobs = generate("Mixed", 16, 8)
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]))
    for spec in jobs.jobs:  # online admissions: a fair amount of room to save
        op.admit(spec)
    free = op.replan(jobs, migration_cost_s=0, time_limit_s=20)
    assert free.cost_after < free.cost_before
    assert free.moved  # cheaper only by moving someone
    assert not check_plan(free.plan, TESTBED, jobs)


def test_replan_with_drifted_profiles_keeps_slos():
    jobs = generate("Mixed", 10, 9)
    base = make_plan(TESTBED, jobs, time_limit_s=20)
    data = {"jobs": []}
    for i, spec in enumerate(jobs.jobs):
        raw = jobs_to_data(JobSet(jobs=[spec]))["jobs"][0]
        if i % 3 == 0:  # a third of the jobs: rollouts 1.5x longer
            raw["rollout"]["duration_s"] = round(spec.rollout.duration_at(0.95) * 1.5, 1)
        data["jobs"].append(raw)
    drifted = jobs_from_data(data, "drifted.yaml")
    result = replan(base, drifted, TESTBED, migration_cost_s=60, time_limit_s=20)
    assert not check_plan(result.plan, TESTBED, drifted)
    assert not result.plan.rejected


def test_link_budget_holds_back_jobs_that_would_flood_the_inter_cluster_link():
    # A 32B job moves 64 GB per sync: 25.6 s over the 20 Gbit/s link, about a tenth of its cycle.
    big = [dict(job(f"J{i}", 150, 100), params_b=32) for i in range(12)]
    jobs = jobset(*big)
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]), link_budget=0.5)
    results = [op.admit(spec) for spec in jobs.jobs]
    assert not all(r.placed for r in results)
    refused = next(r for r in results if not r.placed)
    assert "link is full" in refused.reason
    assert 0 < op.link_load[("rollout", "train")] <= 0.5 + 1e-9
    loads = [sum(32e9 * 2 * 8 / 20e9 / g.cycle_s for _ in g.jobs) for g in op.plan.groups]
    assert sum(loads) == pytest.approx(op.link_load[("rollout", "train")])
    op.release(next(r.plan for r in results if r.placed).groups[0].jobs[0].name)
    assert op.admit(jobs[refused.plan.rejected[0].name]).placed  # room again once a job leaves


def test_no_link_budget_admits_everything_that_fits():
    big = [dict(job(f"J{i}", 150, 100), params_b=32) for i in range(12)]
    jobs = jobset(*big)
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]), link_budget=None)
    assert all(op.admit(spec).placed for spec in jobs.jobs)


def test_a_one_node_topology_takes_a_job_whose_phases_fit_side_by_side():
    # local: one node of two devices. Train on device 0 and rollout on device 1, as make_plan does;
    # a second such job joins that group; none is refused for want of a second node.
    topo = load_topology("local")
    phase = {"gpus": 1, "gpu_type": "CPU", "duration_s": 1.0, "host_mem_gb": 0.1}
    jobs = jobs_from_data({"jobs": [{"name": n, "params_b": 0.001, "slo": 2.0, "rollout": phase, "train": phase}
                                    for n in ("A", "B")]}, "<test>")
    op = OnlinePlanner(topo, JobSet(jobs=[]))
    first, second = op.admit(jobs["A"]), op.admit(jobs["B"])
    assert first.placed and second.placed and first.group == second.group == "g0", (first.reason, second.reason)
    assert second.added_usd_per_hour == 0.0 and second.plan.cost_usd_per_hour == pytest.approx(make_plan(
        topo, jobs, policy="optimal", time_limit_s=5).cost_usd_per_hour)
    assert check_plan(second.plan, topo, jobs) == []


def test_replan_never_stops_a_placed_job(monkeypatch):
    # A solve that runs out of time may return a plan that places fewer jobs (its rejections);
    # the plan in force places them all, so the replan keeps it rather than strand a running job.
    import weave_rl.planner.online as online

    jobs = jobset(job("A", 100, 60), job("B", 100, 60))
    base = make_plan(TESTBED, jobs, time_limit_s=5)
    real = online.plan_optimal

    def stranding(model, **kw):
        result = real(model, **kw)
        kept = [g for g in result.plan.groups if all(j.name != "B" for j in g.jobs)]
        result.plan = result.plan.model_copy(update={"groups": kept})
        return result

    monkeypatch.setattr(online, "plan_optimal", stranding)
    result = replan(base, jobs, TESTBED, time_limit_s=5)
    assert set(result.plan.jobs) == {"A", "B"} and result.moved == []
    assert result.kept.startswith("the new one leaves") and "B" in result.kept
    assert placement(result.plan) == placement(base)


def test_a_replan_keeps_the_plan_in_force_when_the_new_one_is_no_cheaper(monkeypatch):
    # A solve cut short by its time limit returns its fallback: the weave plan from scratch, which
    # moves every job and may cost more. A and B share one training and one rollout node
    # ($42.24 + $14.80 = $57.04/h; the rollout node's cycle 200 s against a solo loop of 160 s,
    # within SLO 2); the fallback here puts each alone ($114.08/h).
    import weave_rl.planner.online as online

    jobs = jobset(job("A", 100, 60), job("B", 100, 60))
    base = make_plan(TESTBED, jobs, time_limit_s=5)
    assert base.cost_usd_per_hour == pytest.approx(TRAIN + ROLLOUT)
    real = online.plan_optimal

    def cut_short(model, **kw):
        result = real(model, **kw)
        result.plan = make_plan(TESTBED, jobs, policy="solo")
        return result

    monkeypatch.setattr(online, "plan_optimal", cut_short)
    result = replan(base, jobs, TESTBED, migration_cost_s=0, time_limit_s=5)
    assert result.moved == [] and result.kept == "the new one saves less than its moves cost"
    assert placement(result.plan) == placement(base)
    assert result.cost_after == pytest.approx(TRAIN + ROLLOUT)


def test_a_job_joins_a_pool_a_plan_put_in_force_for_free():
    # On a100-32 the optimal plan colocates a (rollout and train taking turns on all 32 GPUs); b,
    # whose SLO allows it, time-shares those GPUs: 300 + 200 + 200 + 200 s plus four warm switches,
    # within both caps 2.5 x solo. No node is added, and the plan stays valid.
    topo = load_topology("a100-32")

    def wide(name, rollout, train):
        return {"name": name, "params_b": 1, "slo": 2.5,
                "rollout": {"gpus": 32, "gpu_type": "A100", "duration_s": rollout, "host_mem_gb": 100.0},
                "train": {"gpus": 32, "gpu_type": "A100", "duration_s": train, "host_mem_gb": 100.0}}

    jobs = jobset(wide("a", 300, 200), wide("b", 200, 200))
    start = make_plan(topo, JobSet(jobs=[jobs["a"]]), time_limit_s=5)
    op = OnlinePlanner(topo, JobSet(jobs=[jobs["a"]]), start)
    adm = op.admit(jobs["b"])
    assert adm.placed and adm.group == start.groups[0].name and adm.added_usd_per_hour == 0.0
    plan = Plan.model_validate(adm.plan.model_dump())
    assert_valid(plan, topo, jobs)
    (group,) = plan.groups
    assert group.cycle_s == pytest.approx(900 + 4 * 0.39, abs=0.1)
    assert {g for jp in group.jobs for s in jp.phases if s.phase != "sync" for g in s.gpus} == \
        set(topo.gpus_in(cluster="a100"))


def test_replan_moves_no_job_it_is_told_to_keep():
    jobs = generate("Mixed", 16, 8)
    planners = [OnlinePlanner(TESTBED, JobSet(jobs=[])) for _ in range(2)]
    for op in planners:
        for spec in jobs.jobs:
            op.admit(spec)
    free = planners[0].replan(jobs, migration_cost_s=0, time_limit_s=20)
    assert free.moved
    held = planners[1].replan(jobs, migration_cost_s=0, time_limit_s=20, keep=free.moved)
    assert not set(held.moved) & set(free.moved)
    assert held.cost_after <= held.cost_before + 1e-6
    assert not check_plan(held.plan, TESTBED, jobs)


def test_a_replan_that_would_overload_the_link_keeps_the_plan_in_force():
    # Admission stopped at half the link; the solve places every job, the waiting ones too, and
    # loads the link past that: the plan in force stays, and the reason says so.
    big = [dict(job(f"J{i}", 150, 100), params_b=32) for i in range(12)]
    jobs = jobset(*big)
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]), link_budget=0.5)
    placed = [spec.name for spec in jobs.jobs if op.admit(spec).placed]
    assert len(placed) < len(jobs)
    before = op.plan
    result = op.replan(jobs, time_limit_s=20)
    assert result.moved == [] and "link over 50%" in result.kept
    assert sorted(result.plan.jobs) == sorted(placed) and result.plan.cost_usd_per_hour == before.cost_usd_per_hour
    assert op.link_load[("rollout", "train")] <= 0.5 + 1e-9


def test_a_replan_keeps_its_pinned_groups_timetables_without_a_solver(monkeypatch):
    # Profiles unchanged: every group in force, and every group less one member, keeps the
    # timetable it has (the checker passes it), so none is timetabled again.
    import weave_rl.planner.optimize as optimize

    jobs = generate("Mixed", 16, 8)
    op = OnlinePlanner(TESTBED, JobSet(jobs=[]))
    for spec in jobs.jobs:
        op.admit(spec)
    inside, verdicts, solved = [False], [], []
    real_fits, real_timetable = optimize._Solve.still_fits, optimize.group_timetable

    def fits(self, column):
        inside[0] = True
        try:
            verdicts.append(real_fits(self, column))
            return verdicts[-1]
        finally:
            inside[0] = False

    def timetable(*args, **kwargs):
        solved.extend([1] if inside[0] else [])
        return real_timetable(*args, **kwargs)

    monkeypatch.setattr(optimize._Solve, "still_fits", fits)
    monkeypatch.setattr(optimize, "group_timetable", timetable)
    op.replan(jobs, time_limit_s=20)
    assert len(verdicts) > len(op.plan.groups) and all(verdicts) and not solved
