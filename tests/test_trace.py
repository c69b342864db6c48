"""Trace mode: arrivals through admit, departures through release, cost over time, SLO attainment."""

import pytest

from weave_rl.executor.config import ElasticRules
from weave_rl.executor.controller import Controller
from weave_rl.executor.outputs import metrics
from weave_rl.executor.loop import Stalled
from weave_rl.executor.sim import SimBackend, SimModel
from weave_rl.executor.trace import BaselinePlanner, run_trace, stabilize
from weave_rl.planner.api import make_plan
from weave_rl.planner.online import OnlinePlanner
from weave_rl.profiles.jobs import JobSet

from test_sim import job, topo

PAIR_USD = 8 * 1.85 + 8 * 5.28  # one H20 node + one H800 node


def test_solo_trace_cost_follows_arrivals_and_departures():
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("J1", iterations=2), job("J2", iterations=2, arrival_s=1000.0)])
    r = run_trace(t, jobs, BaselinePlanner(t, "solo"), rules=ElasticRules.off(), model=SimModel(link_sharing=False))
    c = r.controller
    # Each job: two 152 s iterations on its own node pair. J1 holds 0..304, J2 1000..1304.
    assert c.state["J1"].finished_at == pytest.approx(304.0, abs=0.01)
    assert c.state["J2"].finished_at == pytest.approx(1304.0, abs=0.01)
    m = metrics(c, wall_s=r.wall_s, events=r.events, plan_iteration=False)
    assert m["avg_usd_per_hour"] == pytest.approx(PAIR_USD * 608 / 1304, rel=1e-4)
    assert m["peak_usd_per_hour"] == pytest.approx(PAIR_USD)
    assert m["peak_gpus"] == {"rollout": 8, "train": 8}
    assert m["slo_attainment"] == 1.0


def test_a_job_that_does_not_fit_waits_for_a_departure():
    t = topo(1, 1)
    jobs = JobSet(jobs=[job("J1", iterations=2), job("J2", iterations=1, arrival_s=10.0)])
    r = run_trace(t, jobs, BaselinePlanner(t, "solo"), rules=ElasticRules.off(), model=SimModel(link_sharing=False))
    log = r.extra["trace"]
    assert log.waits["J2"] == pytest.approx(294.0, abs=0.01)  # admitted when J1 leaves at 304
    assert r.controller.state["J2"].finished_at == pytest.approx(304.0 + 152.0, abs=0.01)


def test_colocate_trace_keeps_unchanged_groups_running():
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("J1", iterations=3), job("J2", iterations=3, arrival_s=50.0)])
    r = run_trace(t, jobs, BaselinePlanner(t, "colocate"), rules=ElasticRules.off())
    c = r.controller
    assert all(st.finished for st in c.state.values())
    assert not [e for e in c.events if e["event"] == "switch"]  # J2's arrival did not disturb J1


def test_stabilize_keeps_a_groups_nodes():
    t = topo(2, 2)
    one = make_plan(t, JobSet(jobs=[job("J2")]), policy="solo")
    assert one.groups[0].nodes == ["rollout-000", "train-000"] or sorted(one.groups[0].nodes) == \
        ["rollout-000", "train-000"]
    moved = one.model_copy(update={"groups": [g.model_copy(update={"nodes": ["rollout-001", "train-001"]})
                                              for g in one.groups]})
    both = make_plan(t, JobSet(jobs=[job("J1"), job("J2")]), policy="solo")
    fixed = stabilize(both, moved, t)
    j2 = fixed.jobs["J2"][1]
    assert j2.nodes == ["rollout-001", "train-001"]
    assert fixed.jobs["J1"][1].nodes == ["rollout-000", "train-000"]


def test_online_admission_packs_a_second_job_into_the_first_ones_group():
    # Two 100 s + 50 s jobs with SLO 2: the second joins the first's nodes (direct packing), so the
    # cluster never holds more than one node pair, and both stay within their SLO.
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("J1", iterations=4), job("J2", iterations=4, arrival_s=100.0)])
    r = run_trace(t, jobs, OnlinePlanner(t, JobSet()), rules=ElasticRules.off(), model=SimModel(link_sharing=False))
    c = r.controller
    assert all(st.finished for st in c.state.values())
    m = metrics(c, wall_s=r.wall_s, events=r.events, plan_iteration=False)
    assert m["peak_usd_per_hour"] == pytest.approx(PAIR_USD)
    assert m["slo_attainment"] == 1.0
    assert [x["job"] for x in r.extra["trace"].admitted] == ["J1", "J2"]


def test_periodic_reoptimization_is_logged_and_the_trace_completes():
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("J1", iterations=6), job("J2", iterations=6, arrival_s=50.0)])
    r = run_trace(t, jobs, OnlinePlanner(t, JobSet()), rules=ElasticRules.off(), reopt_every_s=300.0,
                  migration_cost_s=0.0, reopt_time_limit_s=2.0)
    assert all(st.finished for st in r.controller.state.values())
    assert len(r.extra["trace"].reopts) >= 2


def test_a_job_no_plan_can_place_ends_a_regrouped_trace_as_never_admitted():
    # J2 asks for SLO 0.5 (faster than alone): no admission or replan places it. Once J1 has left,
    # nothing can change, so the trace ends (it re-optimized every 300 s for ever before).
    t = topo(1, 1)
    jobs = JobSet(jobs=[job("J1", iterations=2), job("J2", iterations=1, arrival_s=10.0, slo=0.5)])
    r = run_trace(t, jobs, OnlinePlanner(t, JobSet()), rules=ElasticRules.off(), reopt_every_s=300.0,
                  migration_cost_s=0.0, reopt_time_limit_s=1.0)
    assert r.extra["trace"].never_admitted == ["J2"]
    # J1 opened nodes, so it was placed by a re-optimization at 0 s (colocated on its H800 node);
    # the periodic one at 300 s ran while J1 did, and none after it left.
    rollout = next(x["duration_s"] for x in r.controller.records if x["phase"] == "rollout")
    assert r.controller.state["J1"].finished_at == pytest.approx(2 * (rollout + 50.0), abs=0.01)
    assert [e["t"] for e in r.extra["trace"].reopts] == [0.0, 300.0]


class _DropsPermits(SimBackend):
    """A broken backend: J2's runs are never started, so nothing of J2's ever reports."""

    steps = 0

    def permit(self, run) -> None:
        if run.job != "J2":
            super().permit(run)

    def step(self) -> bool:
        self.steps += 1
        assert self.steps < 120, "the trace loops on its re-optimization tick"
        return super().step()


def test_a_regrouped_trace_whose_jobs_wait_on_nothing_stops_as_stalled():
    # Without regrouping the backend runs dry and drive reports the stall; with it, the tick kept
    # re-scheduling itself for ever. J1 finishes at about 304 s; the tick at 600 s finds J2 waiting
    # on nothing (it re-optimized, and nothing runs or is scheduled).
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("J1", iterations=2), job("J2", iterations=2, arrival_s=50.0)])
    backend = _DropsPermits(t, jobs)
    with pytest.raises(Stalled, match=r"t=600\.0 s: unfinished jobs J2 wait on nothing but the re-optimization"):
        run_trace(t, jobs, OnlinePlanner(t, JobSet()), rules=ElasticRules.off(), reopt_every_s=300.0,
                  migration_cost_s=0.0, reopt_time_limit_s=1.0, backend=backend)
    assert backend.steps < 100


def test_with_regrouping_an_arrival_that_opens_nodes_is_placed_by_a_reoptimization_before_it_starts():
    # J1 (100 + 50 s, SLO 2) alone: admission opens a node pair ($57.04/h; it opens no colocated
    # group). With regrouping on, the arrival is re-optimized at once, before J1 starts: colocated on
    # one H800 node ($42.24/h; its rollout there takes longer, within SLO 2), no migration paid, and
    # the node pair is never held. Without regrouping it keeps the pair.
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("J1", iterations=4)])

    def run(every):
        return run_trace(t, jobs, OnlinePlanner(t, JobSet()), rules=ElasticRules.off(), reopt_every_s=every,
                         migration_cost_s=800.0, reopt_time_limit_s=2.0, model=SimModel(link_sharing=False))

    r = run(1e6)
    assert r.extra["trace"].reopts == [{"t": 0.0, "moved": [], "usd_per_hour_before": pytest.approx(PAIR_USD),
                                        "usd_per_hour_after": pytest.approx(8 * 5.28), "admitting": "J1"}]
    c = r.controller
    first = next(x for x in c.records if x["phase"] == "rollout")
    assert first["start_s"] == 0.0 and first["duration_s"] > 100.0  # on H800, at once
    m = metrics(c, wall_s=r.wall_s, events=r.events, plan_iteration=False)
    assert m["peak_usd_per_hour"] == pytest.approx(8 * 5.28) and m["slo_attainment"] == 1.0
    plain = metrics(run(None).controller, wall_s=0, events=0, plan_iteration=False)
    assert plain["peak_usd_per_hour"] == pytest.approx(PAIR_USD)


def test_with_regrouping_a_departure_that_frees_no_node_reoptimizes_the_others_at_once():
    # J1 is colocated on one H800 node; J2 (from 50 s) rolls out on an H20 node and trains on J1's
    # ($57.04/h). When J1 leaves (997 s), its node still trains J2, so the release saves nothing:
    # the others are re-optimized at once, not at the next periodic regrouping (none here). J2
    # alone colocated costs $42.24/h, $14.80/h less, against a 60 s migration charge of
    # 57.04 x 60 / 3600 = $0.95/h: it moves after the iteration it is in (ends 1201 s) and rolls out
    # on the H800 node from 1261 s.
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("J1", iterations=5), job("J2", iterations=12, arrival_s=50.0)])
    r = run_trace(t, jobs, OnlinePlanner(t, JobSet()), rules=ElasticRules.off(), reopt_every_s=1e6,
                  migration_cost_s=60.0, reopt_time_limit_s=2.0, model=SimModel(link_sharing=False))
    c = r.controller
    last = r.extra["trace"].reopts[-1]
    assert last == {"t": pytest.approx(c.state["J1"].finished_at), "moved": ["J2"], "admitting": None,
                    "usd_per_hour_before": pytest.approx(PAIR_USD), "usd_per_hour_after": pytest.approx(8 * 5.28)}
    rollouts = [x for x in c.records if x["job"] == "J2" and x["phase"] == "rollout"]
    assert [x["nodes"] for x in rollouts] == ["rollout-000"] * 5 + ["train-000"] * 7
    end4 = next(x["end_s"] for x in c.records if x["job"] == "J2" and x["phase"] == "sync" and x["iteration"] == 4)
    assert rollouts[5]["start_s"] == pytest.approx(end4 + 60.0)
    assert [u for at, u, _ in c.held_timeline if at > end4 - 1e-6 and at < c.state["J2"].finished_at] == \
        [pytest.approx(8 * 5.28)]


def test_regrouping_moves_no_job_whose_slo_budget_is_under_one_migration(monkeypatch):
    # J1 (100 + 50 s, SLO 2) arrives first and is placed colocated on one H800 node; J2 (same, from
    # 50 s) joins on a fresh H20 node and trains on J1's node ($57.04/h). J1 leaves at 997 s. At the
    # regrouping at 1100 s, J2 alone would be cheaper colocated: $42.24/h against $57.04/h, a saving
    # of $14.80/h against a migration charge of 57.04 x 800 / 3600 = $12.68/h. But J2 has finished
    # three iterations, in 660 s from its first start: a budget of 3 x 2 x 152 - 660 = 252 s, under
    # one 800 s migration.
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("J1", iterations=5), job("J2", iterations=8, arrival_s=50.0)])

    def moves():
        r = run_trace(t, jobs, OnlinePlanner(t, JobSet()), rules=ElasticRules.off(), reopt_every_s=1100.0,
                      migration_cost_s=800.0, reopt_time_limit_s=2.0)
        return [m for e in r.extra["trace"].reopts for m in e["moved"]]

    assert moves() == []
    monkeypatch.setattr(Controller, "slo_budget_s", lambda self, name: 1e9)
    assert moves() == ["J2"]  # with budget to spare, the same regrouping moves it


def test_slo_budget_is_what_a_job_may_still_lose():
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("J1", iterations=3, slo=1.5)])
    r = run_trace(t, jobs, BaselinePlanner(t, "solo"), rules=ElasticRules.off(), model=SimModel(link_sharing=False))
    # Alone: 100 + 50 + 2 s sync per iteration, three iterations, cap 1.5 x 152 = 228 s.
    assert r.controller.slo_budget_s("J1") == pytest.approx(3 * (228.0 - 152.0), abs=0.01)
