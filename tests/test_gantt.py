"""Plan pictures: the drawn segments against hand-computed values, and the PNG/HTML files they make."""

import pytest

from weave_rl.planner.gantt import (
    Segment,
    assign_lanes,
    gantt_html,
    gantt_png,
    gpu_summary,
    group_rows,
    job_colours,
    phase_segments,
)
from weave_rl.planner.plan import GroupPlan, JobPlan, PhaseSlot, Plan, SolverInfo


def gpus(node: str, idx) -> list[str]:
    return [f"{node}:{i}" for i in idx]


def slot(phase, start, duration, gpu_ids):
    return PhaseSlot(phase=phase, start_s=start, duration_s=duration, gpus=gpu_ids)


def tiny_plan() -> Plan:
    """g0 (cycle 100): A rolls out on rollout-000 [0, 60), trains on train-000 [60, 90), syncs at 90;
    B trains on train-000 [90, 120) -- wrapping to [0, 20) -- and rolls out on rollout-000 [60, 100).
    g1 (cycle 50): C alone, rollout on half of rollout-001 and all of train-001 (two nodes)."""
    ro, tr = gpus("rollout-000", range(8)), gpus("train-000", range(8))
    a = JobPlan(
        name="A",
        solo_iteration_s=91,
        iteration_s=100,
        phases=[slot("rollout", 0, 60, ro), slot("train", 60, 30, tr), slot("sync", 90, 1, ro)],
    )
    b = JobPlan(
        name="B",
        solo_iteration_s=90,
        iteration_s=100,
        phases=[slot("rollout", 60, 30, ro[:4]), slot("train", 90, 30, tr), slot("sync", 25, 2, ro[:4])],
    )
    c = JobPlan(
        name="C",
        solo_iteration_s=50,
        iteration_s=50,
        phases=[
            slot("rollout", 0, 20, gpus("rollout-001", range(4)) + gpus("train-001", range(2))),
            slot("train", 20, 25, gpus("train-001", range(8))),
            slot("sync", 45, 0, gpus("rollout-001", range(4))),
        ],
    )
    return Plan(
        policy="optimal",
        topology="tiny",
        cost_usd_per_hour=123.4,
        solver=SolverInfo(name="cpsat", status="OPTIMAL"),
        groups=[
            GroupPlan(name="g0", cycle_s=100, nodes=["rollout-000", "train-000"], jobs=[a, b], usd_per_hour=80.0),
            GroupPlan(name="g1", cycle_s=50, nodes=["rollout-001", "train-001", "spare-000"], jobs=[c]),
        ],
    )


def pieces(segments, **match):
    return [
        (s.row, s.start, s.end)
        for s in segments
        if all(getattr(s, k) == v for k, v in match.items())
    ]


def test_wrapped_phase_gives_head_and_tail_in_every_cycle():
    segs = phase_segments(tiny_plan(), cycles=2, by="node")
    # B train: start 90, 30 s, cycle 100 -> [90,100) + [0,20) in cycle 0, [190,200) + [100,120) in cycle 1
    assert pieces(segs, group="g0", job="B", phase="train") == [
        ("train-000", 90, 100),
        ("train-000", 0, 20),
        ("train-000", 190, 200),
        ("train-000", 100, 120),
    ]
    tails = [s for s in segs if s.job == "B" and s.phase == "train" and s.wrapped]
    assert [(s.cycle, s.start) for s in tails] == [(0, 0), (1, 100)]
    assert all(s.phase_start == 90 and s.phase_duration == 30 for s in tails)
    assert all(s.gpus == tuple(f"train-000:{i}" for i in range(8)) for s in tails)


def test_plain_phases_and_sync_by_node():
    segs = phase_segments(tiny_plan(), cycles=2, by="node")
    assert pieces(segs, job="A", phase="rollout") == [("rollout-000", 0, 60), ("rollout-000", 100, 160)]
    assert pieces(segs, job="A", phase="train") == [("train-000", 60, 90), ("train-000", 160, 190)]
    # sync holds no GPU time but is placed on the receivers' rows
    assert pieces(segs, job="A", phase="sync") == [("rollout-000", 90, 91), ("rollout-000", 190, 191)]
    assert pieces(segs, job="B", phase="sync") == [("rollout-000", 25, 27), ("rollout-000", 125, 127)]
    # B's rollout uses half of rollout-000: still one bar on that node's row
    b_roll = [s for s in segs if s.job == "B" and s.phase == "rollout"]
    assert [(s.start, s.end, len(s.gpus)) for s in b_roll] == [(60, 90, 4), (160, 190, 4)]


def test_phase_over_two_nodes_and_zero_length_sync():
    segs = phase_segments(tiny_plan(), cycles=1, by="node")
    assert pieces(segs, job="C", phase="rollout") == [("rollout-001", 0, 20), ("train-001", 0, 20)]
    c_roll = [s for s in segs if s.job == "C" and s.phase == "rollout"]
    assert [len(s.gpus) for s in c_roll] == [4, 2]
    assert pieces(segs, job="C", phase="sync") == [("rollout-001", 45, 45)]  # kept, drawn as a marker
    assert all(s.end <= 50 for s in segs if s.group == "g1")


def test_by_gpu_rows_and_segments():
    plan = tiny_plan()
    g0, g1 = plan.groups
    assert group_rows(g0, "gpu") == gpus("rollout-000", range(8)) + gpus("train-000", range(8))
    # an unused listed node keeps a row of its own; numeric order of GPU indices
    assert group_rows(g1, "gpu") == gpus("rollout-001", range(4)) + gpus("train-001", range(8)) + ["spare-000"]
    assert group_rows(g1, "node") == ["rollout-001", "train-001", "spare-000"]
    segs = phase_segments(plan, cycles=1, by="gpu")
    b_roll = pieces(segs, job="B", phase="rollout")
    assert b_roll == [(f"rollout-000:{i}", 60, 90) for i in range(4)]
    assert all(s.gpus == (s.row,) for s in segs)
    odd = g0.jobs[0].model_copy(update={"phases": [slot("rollout", 0, 1, ["n:10", "n:2"])]})
    ten = GroupPlan(name="x", cycle_s=1, nodes=["n"], jobs=[odd])
    assert group_rows(ten, "gpu") == ["n:2", "n:10"]


def test_segments_stay_inside_the_timeline():
    plan = tiny_plan()
    for cycles in (1, 3):
        for s in phase_segments(plan, cycles=cycles):
            c = 100 if s.group == "g0" else 50
            assert 0 <= s.start <= s.end <= cycles * c
            assert s.cycle * c <= s.start < (s.cycle + 1) * c or s.duration == 0


def test_phase_longer_than_cycle_and_start_beyond_cycle():
    job = JobPlan(
        name="L",
        solo_iteration_s=10,
        iteration_s=10,
        phases=[slot("rollout", 12, 15, ["n:0"]), slot("train", 5, 3, ["n:1"])],
    )
    plan = Plan(
        policy="solo",
        topology="t",
        cost_usd_per_hour=1,
        solver=SolverInfo(name="none", status="FEASIBLE"),
        groups=[GroupPlan(name="g", cycle_s=10, nodes=["n"], jobs=[job])],
    )
    segs = phase_segments(plan, cycles=1, by="gpu")
    assert pieces(segs, phase="rollout") == [("n:0", 0, 10)]
    assert pieces(segs, phase="train") == [("n:1", 5, 8)]


def test_lanes_split_a_node_row_shared_at_once():
    plan = tiny_plan()
    # by node: A rollout [0,60) and B rollout [60,90) never overlap -> one lane; train A/B neither
    lanes = assign_lanes(phase_segments(plan, 2, "node"))
    assert lanes[("g0", "rollout-000", "A", "rollout")] == (0, 1)
    assert lanes[("g0", "rollout-000", "B", "rollout")] == (0, 1)
    assert lanes[("g0", "train-000", "B", "train")] == (0, 1)
    # two jobs on disjoint GPUs of one node at the same time -> two lanes, stable across cycles
    j1 = JobPlan(name="P", solo_iteration_s=5, iteration_s=10, phases=[slot("rollout", 8, 5, ["n:0"])])
    j2 = JobPlan(name="Q", solo_iteration_s=5, iteration_s=10, phases=[slot("rollout", 0, 4, ["n:1"])])
    shared = Plan(
        policy="colocate",
        topology="t",
        cost_usd_per_hour=1,
        solver=SolverInfo(name="none", status="FEASIBLE"),
        groups=[GroupPlan(name="g", cycle_s=10, nodes=["n"], jobs=[j1, j2])],
    )
    lanes = assign_lanes(phase_segments(shared, 2, "node"))
    # P wraps to [0,3) which overlaps Q [0,4)
    assert sorted(lanes.values()) == [(0, 2), (1, 2)]
    assert assign_lanes(phase_segments(shared, 2, "gpu"))[("g", "n:0", "P", "rollout")] == (0, 1)


def test_colours_consistent_and_gpu_summary():
    colours = job_colours(tiny_plan())
    assert list(colours) == ["A", "B", "C"]
    assert len(set(colours.values())) == 3
    assert gpu_summary(gpus("rollout-000", range(8)) + ["train-000:0", "train-000:2", "train-000:3"]) == (
        "rollout-000:0..7, train-000:0,2..3"
    )


def test_bad_arguments():
    with pytest.raises(ValueError):
        phase_segments(tiny_plan(), cycles=0)
    with pytest.raises(ValueError):
        phase_segments(tiny_plan(), by="rack")


@pytest.mark.parametrize("by", ["node", "gpu"])
def test_png_is_written(tmp_path, by):
    out = gantt_png(tiny_plan(), tmp_path / "sub" / "plan.png", cycles=2, by=by)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_png_many_groups_and_empty_plan(tmp_path):
    base = tiny_plan()
    g0 = base.groups[0]
    many = base.model_copy(
        update={"groups": [g0.model_copy(update={"name": f"g{i}", "nodes": [f"r{i}"]}) for i in range(15)]}
    )
    assert gantt_png(many, tmp_path / "many.png").read_bytes()[:4] == b"\x89PNG"
    empty = base.model_copy(update={"groups": []})
    assert gantt_png(empty, tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"
    assert "no groups placed" in gantt_html(empty, tmp_path / "empty.html").read_text()


def test_plan_title_counts_hidden_groups():
    from weave_rl.planner.gantt import plan_title

    base = tiny_plan()
    many = base.model_copy(update={"groups": [base.groups[0]] * 15})
    title = plan_title(many, 12)
    assert "(3 more groups)" in title and "optimal" in title and "$123.40/h" in title and "tiny" in title


@pytest.mark.parametrize("by", ["node", "gpu"])
def test_html_is_self_contained(tmp_path, by):
    out = gantt_html(tiny_plan(), tmp_path / "plan.html", cycles=2, by=by)
    html = out.read_text()
    assert "plotly" in html.lower()
    assert "<script src=\"https://cdn" not in html  # plotly.js inlined: works offline
    assert len(html) > 1_000_000
    for job in ("A", "B", "C"):
        assert f'"name":"{job}"' in html
    assert "g0" in html and "g1" in html and "rollout-000" in html


def test_segment_is_a_plain_value():
    s = Segment(group="g", row="n", job="A", phase="train", start=1.0, end=3.5)
    assert s.duration == 2.5 and not s.wrapped and s.gpus == ()
