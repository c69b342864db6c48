"""The sim backend under the controller, on hand-built plans whose timelines are computed on paper.

Common setup: 8-GPU nodes, a 8 Gbit/s link between the rollout and train clusters (no latency),
1B-parameter jobs in bf16 (16 Gbit of weights), so a sync moves one copy across the link in 2.0 s
(NVLink is made so fast that the local broadcast is ~1e-8 s). Host memory 0 means no warm switch.
"""

import pytest

from weave_rl.executor.config import ElasticRules
from weave_rl.executor.queues import JobSchedule
from weave_rl.executor.run import simulate_plan
from weave_rl.executor.sim import Fault, SimModel
from weave_rl.planner.plan import GroupPlan, JobPlan, PhaseSlot, Plan, SolverInfo
from weave_rl.profiles.jobs import JobSet, JobSpec
from weave_rl.topology.topology import topology_from_data

STATIC = ElasticRules.off()
NO_SHARE = SimModel(link_sharing=False)


def topo(rollout_nodes=1, train_nodes=1, link_gbps=8.0, pcie=256.0):
    cluster = dict(gpus_per_node=8, host_mem_gb=2048, pcie_gbps=pcie, nvlink_gbps=1e9, fabric_gbps=400)
    return topology_from_data({
        "name": "hand",
        "clusters": [{"name": "rollout", "gpu_type": "H20", "nodes": rollout_nodes, **cluster},
                     {"name": "train", "gpu_type": "H800", "nodes": train_nodes, **cluster}],
        "links": [{"between": ["rollout", "train"], "gbps": link_gbps, "latency_ms": 0}],
    })


def job(name, rollout=100.0, train=50.0, rollout_mem=0.0, slo=2.0, **extra):
    return JobSpec(name=name, params_b=1, slo=slo, **extra,
                   rollout={"gpus": 8, "gpu_type": "H20", "duration_s": rollout, "host_mem_gb": rollout_mem},
                   train={"gpus": 8, "gpu_type": "H800", "duration_s": train, "host_mem_gb": 0.0})


def gpus(node):
    return [f"{node}:{i}" for i in range(8)]


def job_plan(name, r_node, t_node, r_start, r_dur, t_start, t_dur, s_start, cycle, s_dur=2.0):
    return JobPlan(name=name, solo_iteration_s=r_dur + t_dur + s_dur, iteration_s=cycle, phases=[
        PhaseSlot(phase="rollout", start_s=r_start, duration_s=r_dur, gpus=gpus(r_node)),
        PhaseSlot(phase="train", start_s=t_start, duration_s=t_dur, gpus=gpus(t_node)),
        PhaseSlot(phase="sync", start_s=s_start, duration_s=s_dur, gpus=gpus(r_node)),
    ])


def plan_of(*groups, elastic=None):
    return Plan(policy="optimal", topology="hand", cost_usd_per_hour=0.0, solver=SolverInfo(name="hand", status="HAND"),
                groups=list(groups), elastic=elastic or {})


def shared_pair(switch=0.0):
    """A and B take turns on one rollout node and one train node; cycle 200 (+ two switches)."""
    c = 200.0 + 2 * switch
    a = job_plan("A", "rollout-000", "train-000", switch, 100, 100 + switch, 50, 150 + switch, c)
    b = job_plan("B", "rollout-000", "train-000", 100 + 2 * switch, 100, 0.0, 50, 50.0, c)
    return plan_of(GroupPlan(name="g0", cycle_s=c, nodes=["rollout-000", "train-000"], jobs=[a, b]))


def solo_group(name, i, r=100.0, t=50.0):
    return GroupPlan(name=f"g{i}", cycle_s=r + t + 2, nodes=[f"rollout-00{i}", f"train-00{i}"],
                     jobs=[job_plan(name, f"rollout-00{i}", f"train-00{i}", 0, r, r, t, r + t, r + t + 2)])


def rows(result, job=None, phase=None):
    return [r for r in result.records if (job is None or r["job"] == job) and (phase is None or r["phase"] == phase)]


def test_two_jobs_take_turns_as_computed_by_hand():
    jobs = JobSet(jobs=[job("A"), job("B")])
    r = simulate_plan(shared_pair(), topo(), jobs, iterations=3, rules=STATIC, model=NO_SHARE)
    st = r.controller.state
    assert [st["A"].rollout_starts[k] for k in range(3)] == pytest.approx([0, 200, 400])
    assert [st["B"].rollout_starts[k] for k in range(3)] == pytest.approx([100, 300, 500])
    trains = rows(r, "B", "train")
    assert [t["start_s"] for t in trains] == pytest.approx([200, 400, 600])
    assert [t["end_s"] for t in trains] == pytest.approx([250, 450, 650])
    assert st["A"].iteration_ends[0] == pytest.approx(152.0)
    assert st["B"].iteration_ends[2] == pytest.approx(652.0)


def test_warm_switch_when_a_gpu_changes_job():
    # 256 GB of rollout state on an 8-GPU node: 32 GB per GPU over 256 Gbit/s PCIe = 1.0 s.
    jobs = JobSet(jobs=[job("A", rollout_mem=256.0), job("B", rollout_mem=256.0)])
    r = simulate_plan(shared_pair(switch=1.0), topo(), jobs, iterations=3, rules=STATIC, model=NO_SHARE)
    assert [x["start_s"] for x in rows(r, "A", "rollout")] == pytest.approx([1, 203, 405])
    assert [x["switch_s"] for x in rows(r, "B", "rollout")] == pytest.approx([1.0, 1.0, 1.0])
    assert [x["switch_s"] for x in rows(r, "A", "train")] == pytest.approx([0.0, 0.0, 0.0])


def test_a_job_alone_at_slo_one_meets_it_with_its_cold_start():
    """The first rollout's warm-up (1.0 s, as above) is paid once by a solo run too: at SLO 1.0 the
    job alone on its solo nodes meets its SLO exactly, its iteration 1/3 s over rollout + train + sync."""
    from weave_rl.executor.outputs import job_metrics

    jobs = JobSet(jobs=[job("A", rollout_mem=256.0, slo=1.0)])
    r = simulate_plan(plan_of(solo_group("A", 0)), topo(), jobs, iterations=3, rules=STATIC, model=NO_SHARE)
    sync = rows(r, "A", "sync")[0]["duration_s"]
    assert rows(r, "A", "rollout")[0]["start_s"] == pytest.approx(1.0)
    m = job_metrics(r.controller)["A"]
    assert m["iteration_s"] == pytest.approx(150 + sync + 1 / 3)
    assert m["solo_sampled_s"] == pytest.approx(m["iteration_s"]) and m["slo_met"]


FAIR = SimModel(link_policy="fair")


def test_concurrent_syncs_share_the_link():
    jobs = JobSet(jobs=[job("A", rollout=10, train=10), job("B", rollout=10, train=10)])
    plan = plan_of(solo_group("A", 0, 10, 10), solo_group("B", 1, 10, 10))
    shared = simulate_plan(plan, topo(2, 2), jobs, iterations=1, rules=STATIC, model=FAIR)
    alone = simulate_plan(plan, topo(2, 2), jobs, iterations=1, rules=STATIC, model=NO_SHARE)
    # Both syncs start at t=20: 16 Gbit each over 8 Gbit/s shared -> 4 Gbit/s each -> 4 s instead of 2 s.
    assert [x["duration_s"] for x in rows(shared, phase="sync")] == pytest.approx([4.0, 4.0], abs=1e-6)
    assert [x["duration_s"] for x in rows(alone, phase="sync")] == pytest.approx([2.0, 2.0], abs=1e-6)


def test_a_sync_speeds_up_when_the_other_transfer_ends():
    # B trains 1 s longer: both share the link from 21 s; A has crossed 8 Gbit alone (1 s at 8),
    # then 4 Gbit/s each: A ends at 21 + 8/4 = 23; B has 16 - 8 = 8 Gbit left, alone again: 24 s.
    jobs = JobSet(jobs=[job("A", rollout=10, train=10), job("B", rollout=10, train=11)])
    plan = plan_of(solo_group("A", 0, 10, 10), solo_group("B", 1, 10, 11))
    r = simulate_plan(plan, topo(2, 2), jobs, iterations=1, rules=STATIC, model=FAIR)
    ends = {x["job"]: x["end_s"] for x in rows(r, phase="sync")}
    assert ends == pytest.approx({"A": 23.0, "B": 24.0}, abs=1e-6)


@pytest.mark.parametrize("slo_a, slo_b, first", [(1.5, 1.2, "B"), (1.2, 1.5, "A")])
def test_deadline_policy_serves_the_least_slack_first(slo_a, slo_b, first):
    # Both syncs start at t=20 (16 Gbit over an 8 Gbit/s link). A solo group's slack per iteration
    # is (slo - 1) x 22 s, so the tighter job crosses alone in 2 s, the other in the 2 s after.
    jobs = JobSet(jobs=[job("A", rollout=10, train=10, slo=slo_a), job("B", rollout=10, train=10, slo=slo_b)])
    plan = plan_of(solo_group("A", 0, 10, 10), solo_group("B", 1, 10, 10))
    r = simulate_plan(plan, topo(2, 2), jobs, iterations=1, rules=STATIC)  # deadline is the default
    ends = {x["job"]: x["end_s"] for x in rows(r, phase="sync")}
    second = "A" if first == "B" else "B"
    assert ends == pytest.approx({first: 22.0, second: 24.0}, abs=1e-6)


def test_deadline_policy_preempts_for_an_earlier_deadline():
    # B (tight SLO) starts its sync 1 s after A: A has crossed 8 Gbit alone; B then takes the whole
    # link (ends 21 + 2 = 23) and A finishes its last 8 Gbit after it (23 + 1 = 24).
    jobs = JobSet(jobs=[job("A", rollout=10, train=10, slo=2.0), job("B", rollout=10, train=11, slo=1.05)])
    plan = plan_of(solo_group("A", 0, 10, 10), solo_group("B", 1, 10, 11))
    r = simulate_plan(plan, topo(2, 2), jobs, iterations=1, rules=STATIC)
    ends = {x["job"]: x["end_s"] for x in rows(r, phase="sync")}
    assert ends == pytest.approx({"A": 24.0, "B": 23.0}, abs=1e-6)


def test_deadline_policy_serves_first_the_job_behind_its_slo(monkeypatch):
    # As above with A tighter (slack 0.2 x 22 = 4.4 s per iteration, B's 11 s), but A is measured
    # 100 s ahead of its SLO and B 50 s behind: B's allowance is max(0, 11 - 50) = 0 s, A's 104.4 s.
    from weave_rl.executor.controller import Controller

    monkeypatch.setattr(Controller, "slo_budget_s", lambda self, name: {"A": 100.0, "B": -50.0}[name])
    jobs = JobSet(jobs=[job("A", rollout=10, train=10, slo=1.2), job("B", rollout=10, train=10, slo=1.5)])
    plan = plan_of(solo_group("A", 0, 10, 10), solo_group("B", 1, 10, 10))
    r = simulate_plan(plan, topo(2, 2), jobs, iterations=1, rules=STATIC)
    ends = {x["job"]: x["end_s"] for x in rows(r, phase="sync")}
    assert ends == pytest.approx({"B": 22.0, "A": 24.0}, abs=1e-6)


def test_unknown_link_policy_is_refused():
    with pytest.raises(ValueError, match="link_policy"):
        SimModel(link_policy="random")


def test_failure_restarts_the_iteration_and_spares_other_groups():
    jobs = JobSet(jobs=[job("A"), job("B")])
    plan = plan_of(solo_group("A", 0), solo_group("B", 1))
    r = simulate_plan(plan, topo(2, 2), jobs, iterations=2, rules=STATIC, model=NO_SHARE,
                      faults=[Fault("train-000", 120.0, 30.0)])
    a, b = r.controller.state["A"], r.controller.state["B"]
    # A's train (100..150) dies at 120; rollout 0 reruns at 120..220, train once the node is back
    # and the rollout is done: 220..270, sync 270..272. Cost of the failure: 120 s.
    assert a.iteration_ends == pytest.approx({0: 272.0, 1: 424.0})
    assert a.restarts == 1
    assert [(x["iteration"], x["attempt"]) for x in rows(r, "A", "rollout")] == [(0, 0), (0, 1), (1, 1)]
    assert b.iteration_ends == pytest.approx({0: 152.0, 1: 304.0})
    assert [e["event"] for e in r.controller.events] == ["node_down", "restart", "node_up"]


def test_long_tail_migration_starts_the_next_rollout_on_freed_gpus():
    jobs = JobSet(jobs=[job("A"), job("B")])
    rules = ElasticRules(migrate=True, lend=False, threshold=0.8, target_share=0.25)
    model = SimModel(tail_share=0.3, tail_slowdown=1.05, link_sharing=False)
    r = simulate_plan(shared_pair(), topo(), jobs, iterations=1, rules=rules, model=model)
    a, b = rows(r, "A", "rollout")[0], rows(r, "B", "rollout")[0]
    # A: 70 s of bulk on 8 GPUs, then its 30 s tail moves to 2 GPUs at 1/1.05 speed: ends 101.5.
    assert (a["start_s"], a["end_s"], a["width_s"]) == pytest.approx((0.0, 101.5, 100.0))
    # B starts at 70 on the 6 freed GPUs (rate 6/8), gets all 8 at 101.5: 23.625 + 46.375 -> bulk ends
    # at 147.875; A's next rollout is not ready then, so B keeps its GPUs: tail 30 s -> 177.875.
    assert (b["start_s"], b["end_s"], b["gpus_at_start"]) == pytest.approx((70.0, 177.875, 6))


def lending_pool():
    """One job S on two A100 nodes (rollout 100 s on one, train 50 s on the other), lending on: its
    idle train GPUs can join its rollout. (topology, jobs, plan, rules)"""
    pool = topology_from_data({"name": "pool", "clusters": [
        {"name": "a100", "gpu_type": "A100", "nodes": 2, "gpus_per_node": 8, "host_mem_gb": 1024}]})
    spec = JobSpec(name="S", params_b=1, rollout={"gpus": 8, "gpu_type": "A100", "duration_s": 100.0},
                   train={"gpus": 8, "gpu_type": "A100", "duration_s": 50.0})
    g = GroupPlan(name="g0", cycle_s=152.0, nodes=["a100-000", "a100-001"],
                  jobs=[job_plan("S", "a100-000", "a100-001", 0, 100, 100, 50, 150, 152)])
    return pool, JobSet(jobs=[spec]), plan_of(g), ElasticRules(migrate=False, lend=True)


def test_idle_training_gpus_are_lent_to_the_rollout():
    pool, jobs, plan, rules = lending_pool()
    r = simulate_plan(plan, pool, jobs, iterations=1, rules=rules, model=SimModel(tail_share=0.3))
    roll = rows(r, "S", "rollout")[0]
    # The 8 waiting training GPUs join: bulk 70 s at rate 2 -> 35 s, tail 30 s at rate 1 -> 65 s.
    assert roll["end_s"] == pytest.approx(65.0)
    assert roll["busy_gpu_s"] == pytest.approx(16 * 35 + 16 * 30)
    assert rows(r, "S", "train")[0]["start_s"] == pytest.approx(65.0)


def test_scalar_profiles_are_deterministic_and_samples_follow_the_seed():
    plan = shared_pair()
    fixed = JobSet(jobs=[job("A"), job("B")])
    runs = [simulate_plan(plan, topo(), fixed, iterations=4, seed=s, rules=STATIC).records for s in (1, 2)]
    assert [x["end_s"] for x in runs[0]] == [x["end_s"] for x in runs[1]]
    noisy = JobSet(jobs=[job("A", rollout={"mean": 100, "std": 10}), job("B", rollout={"mean": 100, "std": 10})])
    ends = [[x["end_s"] for x in simulate_plan(plan, topo(), noisy, iterations=4, seed=s, rules=STATIC).records]
            for s in (1, 1, 2)]
    assert ends[0] == ends[1] and ends[0] != ends[2]


def test_queue_order_follows_planned_offsets_across_the_cycle_wrap():
    plan = shared_pair()
    g = plan.groups[0]
    b = JobSchedule.build(g, g.jobs[1])
    # B: rollout at 100, its train at offset 0 of the next cycle (rel 100), sync at 50 (rel 150).
    assert b.rel == {"rollout": 0.0, "train": 100.0, "sync": 150.0}
    assert b.planned("train", 2) == pytest.approx(600.0)


def test_plan_change_closure_and_hot_joins():
    from weave_rl.executor.switching import changed_jobs, closure, hot_joins

    pair = shared_pair()
    other = plan_of(solo_group("C", 1))
    old = {**pair.jobs, **other.jobs}
    # A's rollout grows: A and B share g0, so both drain; C's group is untouched.
    g0 = pair.groups[0]
    a = g0.jobs[0]
    longer = a.model_copy(update={"phases": [a.phases[0].model_copy(update={"duration_s": 120.0}), *a.phases[1:]]})
    new = {**plan_of(g0.model_copy(update={"jobs": [longer, g0.jobs[1]]})).jobs, **other.jobs}
    changes = changed_jobs(old, new, lambda j: False)
    assert changes == {"A"} and closure(changes, old, new) == {"A", "B"}
    # A finished job leaving is no change; a newcomer next to unchanged members joins hot.
    assert changed_jobs(old, {k: v for k, v in old.items() if k != "C"}, lambda j: j == "C") == set()
    d = job_plan("D", "rollout-001", "train-001", 0, 100, 100, 50, 150, 152)  # slots do not matter here
    joined = GroupPlan(name="g1", cycle_s=152.0, nodes=["rollout-001", "train-001"],
                       jobs=[other.groups[0].jobs[0], d])
    new2 = {**pair.jobs, **plan_of(joined).jobs}
    assert hot_joins(changed_jobs(old, new2, lambda j: False), old, new2) == {"D"}
    # Not on GPUs that a changed job still drains from: there it waits for the switch. B has
    # finished, A moves to node pair 2 and a newcomer E takes node pair 0 (A's) or 3 (free).
    def arrives_hot(node):
        e = plan_of(solo_group("E", node)).jobs
        new3 = {**plan_of(solo_group("A", 2)).jobs, **other.jobs, **e}
        return hot_joins(changed_jobs(old, new3, lambda j: j == "B"), old, new3) == {"E"}
    assert not arrives_hot(0) and arrives_hot(3)


def test_a_newcomer_on_gpus_a_moved_job_drains_from_waits_for_the_switch():
    """A (rollout 100 s, train 50 s) runs colocated on train-000. At 50 s, mid-rollout, a plan moves
    A to train-001 and places a newcomer D (rollout 300 s) colocated on train-000, where A has its
    train of this iteration to run. D waits for the switch at the end of A's iteration (its sync),
    then starts. Joining at once, D's rollout (planned at 50 s) went ahead of A's last train (planned
    at 100 s) on train-000: A trained only once D's rollout was done, and A's move waited as long."""
    def colocated(name, rollout, train):
        return JobSpec(name=name, params_b=1, slo=2.0,
                       rollout={"gpus": 8, "gpu_type": "H800", "duration_s": rollout},
                       train={"gpus": 8, "gpu_type": "H800", "duration_s": train})

    def alone(name, node, r, t, group):
        jp = job_plan(name, node, node, 0, r, r, t, r + t, r + t + 2)
        return GroupPlan(name=group, cycle_s=r + t + 2, nodes=[node], jobs=[jp])

    jobs = JobSet(jobs=[colocated("A", 100.0, 50.0), colocated("D", 300.0, 50.0)])
    moved = plan_of(alone("A", "train-001", 100, 50, "g0"), alone("D", "train-000", 300, 50, "g1"))

    def setup(controller, backend):
        backend.call_at(50.0, lambda: controller.apply_plan(moved, reason="admit D"))

    r = simulate_plan(plan_of(alone("A", "train-000", 100, 50, "g0")), topo(1, 2), jobs, iterations=2,
                      rules=STATIC, model=NO_SHARE, setup=setup)
    a_rollout, a_train, a_sync = rows(r, "A", "rollout")[0], rows(r, "A", "train")[0], rows(r, "A", "sync")[0]
    assert a_train["start_s"] == pytest.approx(a_rollout["end_s"])
    assert rows(r, "D", "rollout")[0]["start_s"] == pytest.approx(a_sync["end_s"])
    assert rows(r, "A", "train")[1]["nodes"] == "train-001"


def test_a_tail_keeps_its_own_gpus_and_never_waits_for_loans_taken_back():
    """A rolls out on two nodes (rollout-000 shared with B, planned after B's rollout there), B trains
    230 s. A's second rollout starts at 159.8 on rollout-001 with rollout-000 lent (B's next rollout
    is planned first there but waits for its sync until 252.3). At A's threshold (229.8) its tail
    keeps 4 GPUs: its own rollout-001 ones, not the loans, which B takes back at 252.3. Keeping the
    loans, the tail was left with no GPU and the run stalled (found on the Production trace)."""
    wide = JobSpec(name="A", params_b=1, rollout={"gpus": 16, "gpu_type": "H20", "duration_s": 100.0},
                   train={"gpus": 8, "gpu_type": "H800", "duration_s": 50.0})
    jobs = JobSet(jobs=[wide, job("B", 20.0, 230.0)])
    c = 252.0
    a = JobPlan(name="A", solo_iteration_s=152, iteration_s=c, phases=[
        PhaseSlot(phase="rollout", start_s=20, duration_s=100, gpus=gpus("rollout-000") + gpus("rollout-001")),
        PhaseSlot(phase="train", start_s=120, duration_s=50, gpus=gpus("train-000")),
        PhaseSlot(phase="sync", start_s=170, duration_s=2, gpus=gpus("rollout-000") + gpus("rollout-001"))])
    b = job_plan("B", "rollout-000", "train-001", 0, 20, 20, 230, 250, c)
    plan = plan_of(GroupPlan(name="g0", cycle_s=c, nodes=["rollout-000", "rollout-001", "train-000", "train-001"],
                             jobs=[a, b]))
    rules = ElasticRules(migrate=True, lend=True, threshold=0.8, target_share=0.25)
    model = SimModel(tail_share=0.3, tail_slowdown=1.05, link_sharing=False)
    r = simulate_plan(plan, topo(2, 2), jobs, iterations=3, rules=rules, model=model)
    assert len(rows(r, "A", "sync")) == len(rows(r, "B", "sync")) == 3
    a1, b1 = rows(r, "A", "rollout")[1], rows(r, "B", "rollout")[1]
    assert a1["start_s"] == pytest.approx(159.81, abs=0.01) and b1["start_s"] == pytest.approx(252.3, abs=0.01)
    assert a1["end_s"] < b1["end_s"]  # its tail did not wait for B to give rollout-000 back


def test_a_job_joining_a_group_that_runs_ahead_of_its_plan_does_not_cut_in():
    """A runs alone 152 s iterations (100 + 50 + 2) under a plan of 252 s (150 + 100 + 2 planned):
    ahead of its planned times. At 1000 s B joins, training on A's node before A's train in each
    planned cycle. B's first cycle is the one of A's next unstarted rollout (iteration 7), so A keeps
    its 152 s rhythm (trains at 100 + 152 k) and B's train follows A's train 6 (ends 1062). Joining
    at the cycle of ``now`` put B's first four trains ahead of A's train 7: A waited 210 s."""
    jobs = JobSet(jobs=[job("A", 100.0, 50.0), job("B", 60.0, 30.0)])
    a = job_plan("A", "rollout-000", "train-000", 0, 150, 150, 100, 250, 252)
    b = job_plan("B", "rollout-001", "train-000", 10, 100, 110, 40, 150, 252)
    alone = plan_of(GroupPlan(name="g0", cycle_s=252, nodes=["rollout-000", "train-000"], jobs=[a]))
    joined = plan_of(GroupPlan(name="g0", cycle_s=252, nodes=["rollout-000", "rollout-001", "train-000"], jobs=[a, b]))

    def setup(controller, backend):
        backend.call_at(1000.0, lambda: controller.apply_plan(joined, reason="admit B"))

    r = simulate_plan(alone, topo(2, 1), jobs, iterations=14, rules=STATIC, model=NO_SHARE, setup=setup)
    assert [x["start_s"] for x in rows(r, "A", "train")] == pytest.approx([100 + 152 * k for k in range(14)])
    assert rows(r, "B", "train")[0]["start_s"] == pytest.approx(1062.0)
