"""Baseline policies (Solo-D, colocate, Weave Algorithm 1) and the round-robin timetable, on small
cases checked by hand on the weave-testbed (H20 $1.85/h, H800 $5.28/h, 8 GPUs and 2048 GB a node,
PCIe 256 Gbit/s, 20 Gbit/s + 1 ms between the clusters, NVLink 3600 Gbit/s)."""

import pytest
import yaml

from weave_rl.planner.baselines import plan_colocate, plan_solo, plan_weave
from weave_rl.planner.check import assert_valid
from weave_rl.planner.model import PlanningModel, ceil_ms
from weave_rl.planner.plan import load_plan
from weave_rl.planner.roundrobin import Member, round_robin_timetable
from weave_rl.profiles.generators import generate, micro_job
from weave_rl.profiles.jobs import JobSet, JobSpec, jobs_to_data
from weave_rl.topology.topology import load_topology, topology_from_data

TESTBED = load_topology("weave-testbed")
NODE_PAIR = 8 * 1.85 + 8 * 5.28  # one H20 node + one H800 node = 57.04 $/h
# Timetables work in whole milliseconds, rounded up.
SYNC_7B = ceil_ms(5.6 + 0.001 + 112 / 3600)  # 14 GB = 112 Gbit over 20 Gbit/s, + 1 ms, + NVLink: 5.633
SWITCH_ROLLOUT_7B = ceil_ms(275.7e9 / 8 * 8 / 256e9)  # a GPU's share of the rollout state over PCIe: 1.078
SWITCH_TRAIN_7B = ceil_ms(240e9 / 8 * 8 / 256e9)  # 0.938


def job(name, rollout_s, train_s, *, slo=2.0, gpus=8, params_b=7, rollout=None, train=None, **kw) -> JobSpec:
    mem = {3: (113.4, 156.2), 7: (275.7, 240.0)}[params_b]
    return JobSpec(
        name=name, params_b=params_b, slo=slo, **kw,
        rollout={"gpus": gpus, "gpu_type": "H20", "duration_s": rollout_s, "host_mem_gb": mem[0], **(rollout or {})},
        train={"gpus": gpus, "gpu_type": "H800", "duration_s": train_s, "host_mem_gb": mem[1], **(train or {})},
    )


def model_of(*jobs, topology=TESTBED) -> PlanningModel:
    return PlanningModel(topology, JobSet(jobs=list(jobs)))


def valid(plan, model: PlanningModel):
    assert_valid(plan, model.topology, model.jobs)
    return plan


def gpus(node: str, n: int = 8) -> tuple[str, ...]:
    return tuple(f"{node}:{i}" for i in range(n))


A = job("A", 100, 60)
B = job("B", 50, 40, slo=2.0)
SOLO_A = 100 + 60 + SYNC_7B


# ----- round robin ---------------------------------------------------------------------------------


def test_round_robin_of_one_job_is_its_solo_iteration():
    model = model_of(A)
    cycle, phases = round_robin_timetable(model, [(A, gpus("rollout-000"), gpus("train-000"))])
    assert cycle == pytest.approx(SOLO_A)
    assert model.solo["A"] == pytest.approx(SOLO_A)
    assert phases["A"]["rollout"] == pytest.approx((0.0, 100.0))
    assert phases["A"]["train"] == pytest.approx((100.0, 60.0))
    assert phases["A"]["sync"] == pytest.approx((160.0, SYNC_7B))


def test_round_robin_packs_b_into_a_bubbles_with_switch_gaps():
    model = model_of(A, B)
    members = [Member(A, gpus("rollout-000"), gpus("train-000")), Member(B, gpus("rollout-000"), gpus("train-000"))]
    rr = round_robin_timetable(model, members)
    a, b = rr.phases["A"], rr.phases["B"]
    # Every GPU hosts two phases now, so each phase follows its warm switch; A's loop sets the cycle.
    assert rr.cycle_s == pytest.approx(SOLO_A)
    assert a["rollout"].start_s == pytest.approx(SWITCH_ROLLOUT_7B)
    assert a["train"].start_s == pytest.approx(SWITCH_ROLLOUT_7B + 100)  # its switch hid in A's rollout
    b_rollout_end = b["rollout"].start_s + 50
    assert b["rollout"].start_s >= SWITCH_ROLLOUT_7B + 100 + SWITCH_ROLLOUT_7B - 1e-9
    assert b["train"].start_s == pytest.approx(SWITCH_ROLLOUT_7B + 160 + SWITCH_TRAIN_7B)  # after A's train
    assert b_rollout_end <= b["train"].start_s + 1e-9


def test_round_robin_accepts_plain_tuples_and_one_step_off_policy():
    stale = job("S", 100, 100, max_staleness=1)
    model = model_of(stale)
    cycle, phases = round_robin_timetable(model, [(stale, gpus("rollout-000"), gpus("train-000"))])
    # The next rollout may start before this sync: the loop may span 2 cycles.
    assert cycle == pytest.approx((200 + SYNC_7B) / 2)
    assert set(phases["S"]) == {"rollout", "train", "sync"}
    plan = valid(plan_solo(model), model)
    assert plan.groups[0].cycle_s == pytest.approx(cycle)


# ----- solo ----------------------------------------------------------------------------------------


def test_solo_one_job_by_hand():
    model = model_of(A)
    plan = valid(plan_solo(model), model)
    assert plan.policy == "solo" and plan.solver.name == "solo" and plan.solver.status == "FEASIBLE"
    assert plan.cost_usd_per_hour == pytest.approx(57.04)
    assert plan.lower_bound_usd_per_hour is None and plan.elastic and plan.topology == "weave-testbed"
    assert plan.quantile == 0.95
    (group,) = plan.groups
    assert group.name == "g0" and group.nodes == ["rollout-000", "train-000"]
    assert group.cycle_s == pytest.approx(SOLO_A)
    jp = group.jobs[0]
    assert jp.solo_iteration_s == pytest.approx(SOLO_A) and jp.iteration_s == group.cycle_s and jp.slo == 2.0
    assert jp.phase("rollout").gpus == list(gpus("rollout-000")) and jp.phase("rollout").gpu_type == "H20"
    assert jp.phase("sync").gpus == jp.phase("rollout").gpus


def test_solo_gives_every_job_fresh_nodes_in_order():
    model = model_of(A, B)
    plan = valid(plan_solo(model), model)
    assert plan.cost_usd_per_hour == pytest.approx(114.08)
    assert [g.nodes for g in plan.groups] == [["rollout-000", "train-000"], ["rollout-001", "train-001"]]


def test_solo_shares_a_node_when_both_phases_use_one_cluster():
    # The seed article's job on 4 x 8 A100: rollout 20 + train 12 GPUs = exactly the 4 nodes.
    topo = load_topology("a100-32")
    model = PlanningModel(topo, generate("seed", 1, 0))
    plan = valid(plan_solo(model), model)
    assert plan.rejected == [] and len(plan.groups[0].nodes) == 4


# ----- weave ---------------------------------------------------------------------------------------


def test_weave_packs_b_into_a_bubbles():
    model = model_of(A, B)
    weave = valid(plan_weave(model), model)
    assert weave.solver.status == "HEURISTIC"
    (group,) = weave.groups
    assert [j.name for j in group.jobs] == ["A", "B"]
    assert group.nodes == ["rollout-000", "train-000"]
    assert weave.cost_usd_per_hour == pytest.approx(NODE_PAIR) == pytest.approx(57.04)
    assert group.cycle_s == pytest.approx(SOLO_A)
    assert valid(plan_solo(model), model).cost_usd_per_hour == pytest.approx(114.08)


def test_weave_scales_rollout_when_the_rollout_node_is_full():
    # Rollout-heavy jobs: both rollouts on one H20 node take 600 s plus switches, over 1.4 x the
    # 425.6 s solo loop, so the second job gets a fresh H20 node and shares the H800 node (+14.80 $/h).
    c, d = job("C", 300, 120, slo=1.4), job("D", 300, 120, slo=1.4)
    model = model_of(c, d)
    plan = valid(plan_weave(model), model)
    (group,) = plan.groups
    assert group.nodes == ["rollout-000", "train-000", "rollout-001"]
    assert plan.cost_usd_per_hour == pytest.approx(NODE_PAIR + 8 * 1.85)
    assert group.jobs[1].phase("rollout").gpus == list(gpus("rollout-001"))


def test_weave_arrival_order_and_incompatible_training_pools():
    # E arrives first (arrival_s), so it founds the group; F's train count 16 differs -> own group.
    e = job("E", 100, 60, arrival_s=10.0)
    f = job("F", 50, 40, gpus=16)
    g = job("G", 50, 40, arrival_s=0.0)
    model = model_of(e, f, g)
    plan = valid(plan_weave(model), model)
    assert [[j.name for j in grp.jobs] for grp in plan.groups] == [["F"], ["G", "E"]]
    assert plan.groups[0].nodes == ["rollout-000", "rollout-001", "train-000", "train-001"]


def test_weave_respects_max_group_size():
    # One long job whose bubbles fit four short ones (SLO 6 tolerates the long cycle).
    big = job("big", 300, 300)
    small = [job(f"s{i}", 50, 50, slo=6.0, params_b=3) for i in range(4)]
    model = model_of(big, *small)
    five = valid(plan_weave(model), model)
    assert [len(g.jobs) for g in five.groups] == [5]
    assert five.cost_usd_per_hour == pytest.approx(57.04)
    three = valid(plan_weave(model, max_group_size=3), model)
    assert [len(g.jobs) for g in three.groups] == [3, 2]
    alone = valid(plan_weave(model, max_group_size=1), model)
    assert alone.cost_usd_per_hour == pytest.approx(valid(plan_solo(model), model).cost_usd_per_hour)
    with pytest.raises(ValueError):
        plan_weave(model, max_group_size=0)


def test_weave_residency_limits_jobs_per_node():
    # 14B rollout state is 445.4 GB per node; a 600 GB node holds only one.
    topo = topology_from_data({
        "name": "small-mem",
        "clusters": [{"name": "rollout", "gpu_type": "H20", "nodes": 4, "host_mem_gb": 600},
                     {"name": "train", "gpu_type": "H800", "nodes": 4, "host_mem_gb": 2048}],
        "links": [{"between": ["rollout", "train"], "gbps": 20, "latency_ms": 1}],
    })
    big = job("big", 300, 300, rollout={"host_mem_gb": 445.4})
    tiny = job("tiny", 50, 50, slo=6.0, rollout={"host_mem_gb": 445.4})
    model = PlanningModel(topo, JobSet(jobs=[big, tiny]))
    plan = valid(plan_weave(model), model)
    (group,) = plan.groups
    assert group.nodes == ["rollout-000", "train-000", "rollout-001"]  # rollout scaling, not packing


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mixed_workload_weave_is_no_dearer_than_solo_and_all_valid(seed):
    jobs = generate("Mixed", 20, seed)
    model = PlanningModel(TESTBED, jobs)
    solo = valid(plan_solo(model), model)
    weave = valid(plan_weave(model), model)
    colocate = valid(plan_colocate(model), model)
    assert solo.rejected == [] and weave.rejected == []
    assert weave.cost_usd_per_hour <= solo.cost_usd_per_hour + 1e-9
    assert all(len(g.jobs) <= 5 for g in weave.groups)
    assert all(len(g.jobs) == 1 and len(g.nodes) == 1 for g in colocate.groups)
    assert len(colocate.groups) + len(colocate.rejected) == 20


def test_weave_on_micro_benchmark_jobs_is_valid():
    jobs = JobSet(jobs=[micro_job(t, f"{t}{i}") for i in range(2) for t in "ABCDE"])
    model = PlanningModel(TESTBED, jobs)
    weave = valid(plan_weave(model), model)
    assert weave.cost_usd_per_hour < valid(plan_solo(model), model).cost_usd_per_hour


# ----- colocate ------------------------------------------------------------------------------------


def test_colocate_runs_both_phases_on_h800_at_h800_speed():
    model = model_of(A, B)
    plan = valid(plan_colocate(model), model)
    assert plan.policy == "colocate"
    assert plan.cost_usd_per_hour == pytest.approx(2 * 8 * 5.28)
    assert [g.nodes for g in plan.groups] == [["train-000"], ["train-001"]]
    ja = plan.groups[0].jobs[0]
    assert ja.phase("rollout").duration_s == pytest.approx(ceil_ms(100 * 4.0 / 3.35))  # 119.403
    assert ja.phase("rollout").gpus == ja.phase("train").gpus == list(gpus("train-000"))
    # The GPUs switch roles each iteration: both warm switches are on the cycle.
    expected = ceil_ms(100 * 4.0 / 3.35) + 60 + SWITCH_ROLLOUT_7B + SWITCH_TRAIN_7B
    assert plan.groups[0].cycle_s == pytest.approx(expected)


def test_colocate_takes_the_fewest_gpus_that_meet_the_slo():
    # On 8 H800s the colocated loop is 119.403 + 60 + switches = 181.4 s > 1.08 x 165.633 s; on 16
    # the phases halve. A job whose SLO no count meets is rejected, naming the SLO.
    wide = job("wide", 100, 60, slo=1.08, train={"gpu_options": [8, 16]})
    tight = job("tight", 100, 60, slo=1.05)
    model = model_of(wide, tight)
    plan = valid(plan_colocate(model), model)
    (group,) = plan.groups
    assert group.nodes == ["train-000", "train-001"] and plan.cost_usd_per_hour == pytest.approx(16 * 5.28)
    assert group.jobs[0].phase("rollout").duration_s == pytest.approx(ceil_ms(50 * 4.0 / 3.35))
    assert [r.name for r in plan.rejected] == ["tight"] and "SLO" in plan.rejected[0].reason


# ----- rejections ------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [plan_solo, plan_colocate, plan_weave])
def test_slo_below_one_is_rejected_and_the_rest_planned(policy):
    ok, bad = job("ok", 100, 60), job("bad", 100, 60, slo=0.9)
    model = model_of(bad, ok)
    plan = valid(policy(model), model)
    assert [r.name for r in plan.rejected] == ["bad"] and "SLO 0.9" in plan.rejected[0].reason
    assert [j.name for g in plan.groups for j in g.jobs] == ["ok"]


@pytest.mark.parametrize("policy", ["weave", "solo"])
def test_command_plans_the_rest_and_reports_the_rejection(tmp_path, capsys, policy):
    from weave_rl.cli.app import main

    jobs = JobSet(jobs=[job("bad", 100, 60, slo=0.9), A, B])
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump(jobs_to_data(jobs)))
    out = tmp_path / "plan.yaml"
    code = main(["plan", "--topology", "weave-testbed", "--jobs", str(tmp_path / "jobs.yaml"),
                 "--policy", policy, "-o", str(out)])
    assert code == 3  # planned, with rejections
    assert "bad" in capsys.readouterr().err
    plan = load_plan(out)  # the YAML round trip keeps it valid
    assert_valid(plan, TESTBED, jobs)
    assert [r.name for r in plan.rejected] == ["bad"] and "SLO 0.9 < 1" in plan.rejected[0].reason
    assert sorted(j.name for g in plan.groups for j in g.jobs) == ["A", "B"]


@pytest.mark.parametrize("spec, words", [
    ({"rollout": {"gpu_type": "A100"}}, "has GPU type A100"),
    ({"gpus": 400}, "wider than every"),
    ({"train": {"host_mem_gb": 3000.0}}, "host memory"),
])
@pytest.mark.parametrize("policy", [plan_solo, plan_weave])
def test_unplaceable_jobs_name_the_cause(policy, spec, words):
    model = model_of(job("bad", 100, 60, **spec), A)
    plan = valid(policy(model), model)
    assert [r.name for r in plan.rejected] == ["bad"] and words in plan.rejected[0].reason
    assert plan.cost_usd_per_hour == pytest.approx(57.04)


@pytest.mark.parametrize("policy", [plan_solo, plan_weave])
def test_out_of_nodes_rejects_the_late_job(policy):
    topo = topology_from_data({
        "name": "tiny",
        "clusters": [{"name": "rollout", "gpu_type": "H20", "nodes": 1},
                     {"name": "train", "gpu_type": "H800", "nodes": 1}],
        "links": [{"between": ["rollout", "train"], "gbps": 20, "latency_ms": 1}],
    })
    # Two rollouts of 200 s cannot share the one H20 node within 1.05 x 225.6 s.
    first, second = job("first", 200, 20, slo=1.05), job("second", 200, 20, slo=1.05)
    model = PlanningModel(topo, JobSet(jobs=[first, second]))
    plan = valid(policy(model), model)
    assert [r.name for r in plan.rejected] == ["second"] and "out of free" in plan.rejected[0].reason


# ----- Weave online (Algorithm 1 one event at a time) ---------------------------------------------


def online_valid(online, *jobs):
    plan = online.plan()
    assert_valid(plan, TESTBED, JobSet(jobs=[j for j in jobs if j.name in plan.jobs]))
    return plan


def test_online_weave_keeps_the_group_in_force_and_fills_a_leavers_bubble():
    # C founds the group and D scales it onto a second H20 node (as above); after C leaves, D keeps
    # its nodes and the shared H800 node, C's rollout node is freed, and E packs into D's group for
    # free (the 425.6 s cycle holds 300 + 80 s of rollouts and 120 + 80 s of trains; E's cap is
    # 3 x 165.6 s).
    from weave_rl.planner.baselines import OnlineWeave

    c, d, e = job("C", 300, 120, slo=1.4), job("D", 300, 120, slo=1.4), job("E", 80, 80, slo=3.0)
    online = OnlineWeave(TESTBED)
    assert online.admit(c) == "g0" and online.admit(d) == "g0"
    before = online_valid(online, c, d)
    assert before.groups[0].nodes == ["rollout-000", "train-000", "rollout-001"]
    online.release("C")
    after = online_valid(online, d)
    (group,) = after.groups
    assert group.nodes == ["train-000", "rollout-001"]
    assert group.jobs[0].phase("rollout").gpus == list(gpus("rollout-001"))
    assert after.cost_usd_per_hour == pytest.approx(NODE_PAIR)
    assert online.admit(e) == "g0"
    full = online_valid(online, d, e)
    assert full.groups[0].nodes == ["train-000", "rollout-001"]
    assert full.cost_usd_per_hour == pytest.approx(NODE_PAIR)


def test_online_weave_frees_an_emptied_group_and_names_new_groups_apart():
    from weave_rl.planner.baselines import OnlineWeave

    f, g = job("F", 100, 60, gpus=16), job("G", 100, 60)
    online = OnlineWeave(TESTBED)
    assert online.admit(f) == "g0" and online.admit(g) == "g1"  # train pools of 16 and 8 GPUs: apart
    online.release("F")
    plan = online_valid(online, g)
    assert [grp.name for grp in plan.groups] == ["g1"]
    h = job("H", 100, 60, gpus=16)
    assert online.admit(h) == "g2"
    plan = online_valid(online, g, h)
    # F's two H20 and two H800 nodes came back in id order: H takes the same ones.
    assert plan.groups[1].nodes == ["rollout-000", "rollout-001", "train-000", "train-001"]
    online.release("G")
    online.release("H")
    assert online.plan().groups == [] and online.book.memory.used == {n: {} for n in online.book.memory.used}


def test_online_weave_in_force_admits_around_a_given_plan():
    from weave_rl.planner.baselines import OnlineWeave

    model = model_of(A)
    plan = valid(plan_weave(model), model)
    online = OnlineWeave.in_force(TESTBED, plan, {"A": A})
    assert online.admit(B) == "g0"  # B packs into A's bubbles, as in one offline plan of both
    assert online_valid(online, A, B).cost_usd_per_hour == pytest.approx(NODE_PAIR)
