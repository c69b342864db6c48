"""Simulator benchmark: the figures of issue 5, measured on the ``sim`` backend.

Run from the repository root::

    .venv/bin/python -m bench.simulate [--quick] [--jobs 200] [--seed 0]

Sections (each ends in verdicts at the bottom):

a. Weave micro-benchmarks (a), (b), (c) (the jobs of ``bench.planner``), in both phase splits
   (``paper``: derived from the paper's configurations; ``original``), planned by solo, colocate,
   weave, optimal ($/h objective) and optimal (throughput objective) on ``weave-testbed`` (room for
   every policy). Throughput per $ = job-iterations per hour / the plan's $/h: as planned
   (``iteration_s``), and simulated for 20 iterations (steady state) without and with the plan's
   elastic rules. Each policy's ratio to Solo-D on its own line. Floor (paper split): optimal's
   planned ratio >= the paper's Weave 1.82x / 1.90x / 1.99x, in (c) >= 2.0 x 574.6 / 630.8 = 1.82x
   (what (c)'s own cost ratio and Table 4 imply; both printed).
b. A Mixed trace (``weave_rl.profiles.generators.generate("Mixed", N, seed)``: Table 6 phase ranges, Poisson
   arrivals of mean gap 1800 s, SLO ~ U(1, 2), 50-300 iterations) on ``weave-testbed`` with duration
   variance: every phase ``{mean: d, std: 0.1 d}``. Time-averaged and peak $/h, SLO attainment,
   admission wait for solo, colocate, weave and optimal-with-admission (``weave_rl.planner.online``; reported
   as missing while it does not exist). Then the admission policy planned at quantile 0.95 against
   ``max`` (Weave's worst case). Target: lower cost at 0.95 with SLO attainment >= 99%.
   Every figure is given with syncs sharing the single 20 Gbit/s inter-cluster link (the physical
   model) and without sharing (the planner's sync model has no contention). On the shared link the
   controller serves syncs earliest deadline first (deadline = start + planned sync + the group's
   least SLO slack per iteration); one more row shows the admission policy with an even split.
c. Drift templates (Weave 6.6: increasing / decreasing / mixed at M = 0.5, 1.0, 1.5) on a shorter
   Mixed trace: cost and SLO attainment of the static plan against drift-triggered replanning that
   charges moved jobs a migration of 300 s (the paper measured 197-419 s). Paper: static costs
   1.08-1.11x of hourly regrouping and keeps 95.6-98.7% attainment.
d. Speed: events per second and wall time of the N-job trace (simulation without planner time, and
   in all); target <= 60 s on 2 cores.
e. Fidelity of every plan in ``plans/``: the largest deviation of a job's simulated steady-state
   iteration from the plan's ``iteration_s``, deterministic durations, for the plan as the planner
   models it (static, no link sharing; target <= 1%), with shared links, and with the elastic rules.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

from bench.planner import MICRO, micro_jobs, say, table
from weave_rl.executor.config import ElasticRules
from weave_rl.executor.drift import DriftReplanner, parse_drift
from weave_rl.executor.outputs import metrics
from weave_rl.executor.run import simulate_plan
from weave_rl.executor.sim import SimModel
from weave_rl.executor.trace import BaselinePlanner, run_trace
from weave_rl.planner.api import make_plan
from weave_rl.planner.model import PlanningModel
from weave_rl.profiles.generators import generate
from weave_rl.profiles.jobs import JobSet, JobSpec
from weave_rl.topology.topology import Topology, load_topology

POLICIES = ["solo", "colocate", "weave", "optimal"]
PAPER_VS_SOLO = {"a": 1.82, "b": 1.90, "c": 1.99}
PAPER_VS_VERL = {"a": 1.47, "b": 1.35, "c": 1.43}
CV = 0.1
MIGRATION_S = 300.0
REGROUP_TIME_LIMIT_S = 6.0  # solver time per periodic re-optimization of the optimal policy (section b; at 2 s, 45 of 209 on Production ran out of it and kept the plan in force)


class Timed:
    """An online planner whose admit / release / replan wall time adds up in ``planning_s``."""

    def __init__(self, inner):
        self.inner = inner
        self.planning_s = 0.0

    @property
    def plan(self):
        return self.inner.plan

    def _timed(self, name, *args, **kwargs):
        started = time.perf_counter()
        try:
            return getattr(self.inner, name)(*args, **kwargs)
        finally:
            self.planning_s += time.perf_counter() - started

    def admit(self, job):
        return self._timed("admit", job)

    def release(self, name):
        return self._timed("release", name)

    def replan(self, jobs, **kwargs):
        return self._timed("replan", jobs, **kwargs)


def online_planner(topology: Topology, quantile):
    """``weave_rl.planner.online.OnlinePlanner`` on an empty cluster, or None while it does not exist."""
    try:
        from weave_rl.planner.online import OnlinePlanner
    except ImportError:
        return None
    return Timed(OnlinePlanner(topology, JobSet(), None, quantile=quantile))


# ----- a. micro-benchmarks ------------------------------------------------------------------------
# (label, policy, objective)
MICRO_POLICIES = [("solo", "solo", "cost"), ("colocate", "colocate", "cost"), ("weave", "weave", "cost"),
                  ("optimal $/h", "optimal", "cost"), ("optimal iter/$", "optimal", "throughput")]
# Where a scenario's reported ratio exceeds what its own configuration's cost ratio and Table 4
# imply, the floor is the implied figure: (c) holds 3 jobs on half Solo-D's GPUs (cost ratio 2.0)
# at 630.8 s per iteration where Solo-D takes 574.6 s.
PAPER_IMPLIED = {"c": 2.0 * 574.6 / 630.8}


def _per_hour(plan) -> float:
    return sum(3600.0 / j.iteration_s for g in plan.groups for j in g.jobs)


def section_micro(args) -> list[str]:
    """Each scenario, both phase splits: planned and simulated (static, and with the plan's elastic
    rules) job-iterations per $, each policy on its own line, ratios to Solo-D."""
    from weave_rl.profiles.generators import MICRO_SPLITS

    topo = load_topology("weave-testbed")
    verdicts = []
    for split in MICRO_SPLITS:
        for key, title, types, _, _, options in MICRO:
            jobs = micro_jobs(types, options, split)
            rows, fig = [], {}
            for label, policy, objective in MICRO_POLICIES:
                plan = make_plan(topo, jobs, policy=policy, objective=objective, time_limit_s=args.time_limit,
                                 threads=args.threads)
                per = {"plan": _per_hour(plan) / plan.cost_usd_per_hour}
                for mode, rules in (("static", ElasticRules.off()), ("elastic", None)):
                    r = simulate_plan(plan, topo, jobs, iterations=args.micro_iterations, seed=args.seed, rules=rules)
                    m = metrics(r.controller, wall_s=r.wall_s, events=r.events)
                    per[mode] = sum(3600.0 / j["steady_iteration_s"] for j in m["per_job"].values()) / plan.cost_usd_per_hour
                fig[label] = per
                groups = "; ".join("+".join(j.name for j in g.jobs) + f" {len(g.nodes)}n @{g.cycle_s:.1f}s"
                                   for g in plan.groups)
                rows.append([label, plan.cost_usd_per_hour, per["plan"], per["static"], per["elastic"], None, None,
                             None, groups])
            for row in rows:
                row[5:8] = [fig[row[0]][mode] / fig["solo"][mode] for mode in ("plan", "static", "elastic")]
            paper = PAPER_VS_SOLO[key]
            implied = PAPER_IMPLIED.get(key)
            say(table(f"a. micro ({key}) {title}, {split} split: job-iterations per $ and x Solo-D "
                      f"(paper: Weave {paper}x Solo-D" + (f", {implied:.2f}x implied by its cost ratio and Table 4"
                                                          if implied else "") + ")",
                      ["policy", "$/h", "iter/$ plan", "iter/$ sim", "iter/$ sim+el", "x solo plan",
                       "x solo sim", "x solo sim+el", "groups (nodes, cycle)"], rows, align="lrrrrrrrl"))
            floor = implied or paper
            for label, _, _ in MICRO_POLICIES[2:]:
                f = fig[label]
                ratio = {mode: f[mode] / fig["solo"][mode] for mode in f}
                head = f"a. micro ({key}) {split} split, {label}: x Solo-D planned {ratio['plan']:.3f}, " \
                       f"simulated {ratio['static']:.3f} static / {ratio['elastic']:.3f} elastic"
                if label == "optimal iter/$" and split == "paper":
                    ok = ratio["plan"] >= floor - 5e-4
                    verdicts.append(f"{'PASS' if ok else 'FAIL'} {head} (floor: planned >= {floor:.2f}, the paper's "
                                    f"Weave {paper:.2f}" + (f", implied {implied:.2f}" if implied else "") + ")")
                else:
                    verdicts.append(f"INFO {head}")
            ok = fig["optimal iter/$"]["plan"] >= max(fig[p]["plan"] for p in fig) * (1 - 1e-9)
            verdicts.append(f"{'PASS' if ok else 'FAIL'} a. micro ({key}) {split} split: optimal iter/$ plans the "
                            f"most iterations per $ of every policy ({fig['optimal iter/$']['plan']:.4f})")
            say()
    return verdicts


# ----- b. trace ----------------------------------------------------------------------------------------
def noisy(job: JobSpec, cv: float = CV) -> JobSpec:
    """The job with each phase duration as a normal law of the same mean and a ``cv`` spread."""
    update = {}
    for kind in ("rollout", "train"):
        phase = job.phase(kind)
        mean = phase.duration_s.mean()
        update[kind] = phase.model_copy(update={"duration_s": phase.duration_s.parse({"mean": mean,
                                                                                       "std": round(cv * mean, 3)})})
    return job.model_copy(update=update)


def trace_jobs(count: int, seed: int) -> JobSet:
    return JobSet(jobs=[noisy(j) for j in generate("Mixed", count, seed).jobs])


@dataclass
class TraceRun:
    label: str
    avg: float = math.nan
    peak: float = math.nan
    slo: float = math.nan
    wait: float = math.nan
    never: int = 0
    events: int = 0
    sim_s: float = math.nan
    plan_s: float = math.nan
    note: str = ""
    usd: float = math.nan  # total $ over the run
    horizon_s: float = math.nan  # last job's end
    max_wait: float = math.nan
    link_load: float = math.nan  # inter-cluster link: offered sync load / its capacity, whole run
    link_peak: float = math.nan  # ... in the busiest hour
    gpu_h: dict = None  # GPU-hours held per cluster
    util: dict = None  # compute GPU-s / held GPU-s per cluster
    controller: object = None  # the run's controller (records, held timeline), for the analyses below
    log: object = None  # the trace's log (admissions, waits, re-optimizations)


def link_load(controller, topo: Topology) -> tuple[float, float]:
    """Offered load of the inter-cluster link(s) from the sync records: each sync of a job whose
    rollout and train ran in different clusters puts one model copy (params x bytes) on the link;
    summed bits / (capacity x horizon), and the same in the busiest hour (by sync start)."""
    gbps = sum(link.gbps for link in topo.spec.links) if topo.spec.links else math.nan
    clusters: dict[str, dict[str, str]] = {}
    for r in controller.records:
        if r["phase"] in ("rollout", "train"):
            clusters.setdefault(r["job"], {})[r["phase"]] = r["cluster"]
    hours: dict[int, float] = {}
    total = 0.0
    for r in controller.records:
        c = clusters.get(r["job"], {})
        if r["phase"] != "sync" or c.get("rollout") == c.get("train"):
            continue
        spec = controller.specs[r["job"]]
        seconds = spec.params_b * 1e9 * spec.bytes_per_param * 8 / (gbps * 1e9)
        total += seconds
        hours[int(r["start_s"] // 3600)] = hours.get(int(r["start_s"] // 3600), 0.0) + seconds
    horizon = max(controller.now, 1e-9)
    return total / horizon, (max(hours.values()) / 3600 if hours else 0.0)


def run_one(label: str, topo: Topology, jobs: JobSet, planner, *, share: bool, seed: int, drift=None,
            replan: bool = False, threads: int = 2, time_limit: float = 10.0,
            link_policy: str = "deadline", regroup_every_s: float | None = None) -> TraceRun:
    if planner is None:
        return TraceRun(label, note="planner.online is not available yet")
    setup = None
    if replan:
        def setup(controller, _backend):
            controller.extra_drift = DriftReplanner(controller, planner, migration_cost_s=MIGRATION_S,
                                                    time_limit_s=time_limit, threads=threads)
    started = time.perf_counter()
    r = run_trace(topo, jobs, planner, seed=seed, model=SimModel(link_sharing=share, link_policy=link_policy),
                  drift=drift, threads=threads, setup=setup, reopt_every_s=regroup_every_s,
                  migration_cost_s=MIGRATION_S, reopt_time_limit_s=REGROUP_TIME_LIMIT_S)
    total = time.perf_counter() - started
    m = metrics(r.controller, wall_s=r.wall_s, events=r.events, plan_iteration=False)
    log = r.extra["trace"]
    plan_s = getattr(planner, "planning_s", math.nan)
    waits = list(log.waits.values())
    replans = len(getattr(r.controller, "extra_drift", None).log) if replan else 0
    load, peak_load = link_load(r.controller, topo)
    return TraceRun(label, m["avg_usd_per_hour"], m["peak_usd_per_hour"], m["slo_attainment"],
                    sum(waits) / len(waits) if waits else 0.0, len(log.never_admitted), r.events,
                    total - (plan_s if not math.isnan(plan_s) else 0.0), plan_s,
                    f"{replans} replans" if replan else "", usd=m["usd"], horizon_s=m["horizon_s"],
                    max_wait=max(waits) if waits else 0.0, link_load=load, link_peak=peak_load,
                    gpu_h={c: v["held_gpu_s"] / 3600 for c, v in m["clusters"].items()},
                    util={c: v["utilization"] for c, v in m["clusters"].items()}, controller=r.controller, log=log)


def planner_for(policy: str, topo: Topology, quantile, args):
    if policy == "optimal":
        return online_planner(topo, quantile)
    return BaselinePlanner(topo, policy, quantile=quantile, time_limit_s=args.time_limit, threads=args.threads)


def trace_rows(runs: list[TraceRun]) -> list[list]:
    return [[r.label, r.avg, r.peak, None if math.isnan(r.slo) else 100 * r.slo, r.wait, r.never, r.events,
             r.sim_s, r.plan_s, r.note] for r in runs]


TRACE_HEADER = ["run", "avg $/h", "peak $/h", "SLO %", "wait s", "never", "events", "sim s", "plan s", "note"]
PAPER_TRACE_VS_SOLO = 1.84  # Weave 6.5: $510/h against Solo-D's $0.94k/h ($188.8k vs $347.9k)
ROOMY = "weave-testbed-x10"  # 410 + 410 nodes: no policy waits for capacity on these traces
OPT_VS_WEAVE = 1.2  # floor: optimal at least this much cheaper than weave, at >= 99 % SLO attainment


def trace_sets(args) -> list[tuple[str, JobSet, object]]:
    """(name, jobs, planning quantile): today's Mixed trace (durations +-10 %) at 0.95, and the
    paper's statistics (weave_rl.profiles.generators, family Production) at max (the paper's
    worst-case planning) and at 0.95."""
    production = generate("Production", args.jobs, args.seed)
    sets = {"mixed": ("Mixed", trace_jobs(args.jobs, args.seed), 0.95), "production-max": ("Production", production, "max"),
            "production-0.95": ("Production", production, 0.95)}
    return [sets[k] for k in args.traces.split(",")]


def section_trace(args) -> tuple[list[str], TraceRun | None]:
    """Every policy on a topology with room for all (no admission waits), the shared 20 Gbit/s link:
    total $ for the same work, that $ over the same window (the latest end of any policy), SLO
    attainment, the link's offered load, GPU-hours held per cluster; then waits on weave-testbed's
    capacity, reported apart."""
    roomy = load_topology(ROOMY)
    verdicts: list[str] = []
    main_run = None
    for name, jobs, q in trace_sets(args):
        runs = {}
        regroup = f"optimal+regroup {args.regroup_every_h:g}h"
        for policy in POLICIES + ([regroup] if args.regroup_every_h > 0 else []):
            every = args.regroup_every_h * 3600 if policy == regroup else None
            runs[policy] = run_one(policy, roomy, jobs, planner_for(policy.split("+")[0], roomy, q, args),
                                   share=True, seed=args.seed, threads=args.threads, time_limit=args.time_limit,
                                   regroup_every_s=every)
            say(f"  ... {name} q={q} {policy}: ${runs[policy].usd:,.0f}, SLO {100 * runs[policy].slo:.1f}%")
        if main_run is None:
            main_run = runs["optimal"] if not math.isnan(runs["optimal"].avg) else runs["weave"]
        window = max(r.horizon_s for r in runs.values() if not math.isnan(r.horizon_s))
        solo = runs["solo"]
        rows = []
        for policy, r in runs.items():
            clusters = sorted(r.gpu_h or {})
            rows.append([policy, r.usd / 1000, r.usd / (window / 3600), r.horizon_s / 3600,
                         100 * r.slo, r.wait, r.max_wait, r.never, 100 * r.link_load, 100 * r.link_peak,
                         " ".join(f"{c} {r.gpu_h[c]:,.0f}" for c in clusters),
                         " ".join(f"{c} {100 * r.util[c]:.0f}%" for c in clusters),
                         solo.usd / r.usd if r.usd else math.nan])
        say(table(f"b. {len(jobs)} {name} jobs on {ROOMY} (room for every policy), q={q}, shared link; "
                  f"$/h over the same window of {window / 3600:.1f} h",
                  ["policy", "total k$", "$/h (window)", "last end h", "SLO %", "wait s", "max wait s", "never",
                   "link load %", "busiest h %", "GPU-h held", "utilization", "solo $ / $"], rows,
                  align="lrrrrrrrrrllr"))
        for policy, r in runs.items():
            if r.never:
                verdicts.append(f"INFO b. {name} q={q}: {policy} never admitted {r.never} job(s) (their SLO cannot "
                                f"be met on its placement): its total $ is for less work")
            if r.wait > 0:
                verdicts.append(f"INFO b. {name} q={q}: {policy} made jobs wait {r.wait:.0f} s on average (at most "
                                f"{r.max_wait:.0f} s) with room for every job: its admission keeps the link's sync "
                                f"load within its budget (planner/admission.py link_budget)")
        weave = runs["weave"]
        # The floor asks for one optimal run both cheap enough and at the SLO: the cheapest of those
        # at the SLO, else the cheapest.
        optimal_runs = [r for p, r in runs.items() if p.startswith("optimal")]
        at_slo = [r for r in optimal_runs if r.slo >= 0.99]
        opt = min(at_slo or optimal_runs, key=lambda r: r.usd if not math.isnan(r.usd) else math.inf)
        snap = regroup_bound(weave, jobs, roomy, q, args)
        say(table(f"b. {name} q={q}: weave's held $/h at {len(snap)} instants against the optimal plan (and its "
                  f"lower bound) of the same live jobs, re-planned from scratch (free migration)",
                  ["t h", "live jobs", "weave $/h", "optimal $/h", "bound $/h", "weave / optimal"],
                  [[t / 3600, n, w, o, b, w / o if o else math.nan] for t, n, w, o, b in snap]))
        sums = [sum(x[i] for x in snap) for i in (2, 3, 4)]
        bound = (sums[0] / sums[1], sums[0] / sums[2]) if snap and sums[1] > 0 and sums[2] > 0 else (math.nan,) * 2
        ratio = solo.usd / weave.usd
        line = (f"b. {name} q={q}: weave {ratio:.2f}x cheaper than Solo-D for the same work (paper: "
                f"{PAPER_TRACE_VS_SOLO}x on its 200-job trace)")
        if abs(ratio / PAPER_TRACE_VS_SOLO - 1) > 0.10:
            line += "; measured: " + trace_cause(solo, weave)
        verdicts.append(f"INFO {line}")
        if not math.isnan(opt.usd):
            ok = weave.usd >= OPT_VS_WEAVE * opt.usd and opt.slo >= 0.99
            text = (f"b. {name} q={q}: {opt.label} {weave.usd / opt.usd:.2f}x cheaper than weave (${opt.usd:,.0f} vs "
                    f"${weave.usd:,.0f}), SLO {100 * opt.slo:.1f}% vs {100 * weave.slo:.1f}% (floor: >= {OPT_VS_WEAVE}x "
                    f"at >= 99%); link load {100 * opt.link_load:.0f}% vs {100 * weave.link_load:.0f}%; mean admission "
                    f"wait {opt.wait / 3600:.1f} h vs {weave.wait / 3600:.1f} h")
            if not ok:
                text += (f"; measured: weave's held $/h is {bound[0]:.3f}x the optimal plan of the same live jobs "
                         f"re-planned from scratch ({bound[1]:.3f}x its lower bound) over {len(snap)} instants")
                if bound[0] < OPT_VS_WEAVE:
                    text += f", so no regrouping, even with free migration, is {OPT_VS_WEAVE}x cheaper"
                if opt.slo < 0.99:
                    misses = slo_misses(opt)
                    text += f"; optimal's SLO misses: {misses}"
            verdicts.append(f"{'PASS' if ok else 'FAIL'} {text}")
        say()
    # Waits when the capacity is set (weave-testbed), apart from the costs above.
    if not args.quick and not args.no_capacity:
        topo = load_topology("weave-testbed")
        name, jobs, q = "Production", generate("Production", args.jobs, args.seed), "max"
        rows = []
        for policy in ("solo", "weave", "optimal"):
            r = run_one(policy, topo, jobs, planner_for(policy, topo, q, args), share=True, seed=args.seed,
                        threads=args.threads, time_limit=args.time_limit)
            rows.append([policy, 100 * r.slo, r.wait / 3600, r.max_wait / 3600, r.never, r.usd / 1000])
        say(table(f"b. waits on weave-testbed's capacity (328 + 328 GPUs), {name} q={q}",
                  ["policy", "SLO %", "mean wait h", "max wait h", "never", "total k$"], rows))
        say()
    return verdicts, main_run


SNAPSHOTS = 12  # instants of section b's re-planning comparison


def regroup_bound(run: TraceRun, jobs: JobSet, topo: Topology, quantile, args) -> list[tuple]:
    """(t, live jobs, run's held $/h, optimal $/h, its lower bound) at ``SNAPSHOTS`` instants evenly
    spread over the run's busy span: the jobs live then (first rollout started, last sync not yet
    ended) planned from scratch by the optimal policy (cost objective) on the same topology."""
    c = run.controller
    if c is None or not c.records:
        return []
    first, last = {}, {}
    for r in c.records:
        first[r["job"]] = min(first.get(r["job"], math.inf), r["start_s"])
        last[r["job"]] = max(last.get(r["job"], 0.0), r["end_s"])
    lo, hi = min(first.values()), max(last.values())
    out = []
    timeline = c.held_timeline
    for k in range(SNAPSHOTS):
        t = lo + (k + 0.5) * (hi - lo) / SNAPSHOTS
        live = [n for n in jobs.names if first.get(n, math.inf) <= t < last.get(n, -1.0)]
        if not live:
            continue
        held = next((usd for (t0, usd, _g), nxt in zip(timeline, timeline[1:] + [(math.inf, 0, {})])
                     if t0 <= t < nxt[0]), math.nan)
        plan = make_plan(topo, JobSet(jobs=[jobs[n] for n in live]), policy="optimal", quantile=quantile,
                         time_limit_s=args.snapshot_time_limit, threads=args.threads)
        out.append((t, len(live), held, plan.cost_usd_per_hour,
                    plan.lower_bound_usd_per_hour if plan.lower_bound_usd_per_hour is not None else math.nan))
    return out


def slo_misses(run: TraceRun) -> str:
    """The jobs that missed their SLO, and what their time over the cap is made of, measured: syncs
    longer than planned (waits on the shared link), migrations (``MIGRATION_S`` per move of a
    regrouping), and the rest: waits for co-runners' phases and warm switches, which the plan fits
    into bubbles at the planning quantile but which weigh more when phases run shorter."""
    from weave_rl.executor.outputs import job_metrics

    c = run.controller
    per = job_metrics(c)
    sync: dict[str, list[float]] = {}
    for r in c.records:
        if r["phase"] == "sync":
            sync.setdefault(r["job"], []).append(r["duration_s"])
    moves: dict[str, int] = {}
    for e in (run.log.reopts if run.log is not None else []):
        for m in e["moved"]:
            moves[m] = moves.get(m, 0) + 1
    parts, excess, by_sync, by_moves = [], 0.0, 0.0, 0.0
    for name, j in per.items():
        if j["slo_met"]:
            continue
        cap = j["slo"] * j["solo_sampled_s"]
        entry = c.job_plans.get(name)
        planned = next((p.duration_s for p in entry[1].phases if p.phase == "sync"), math.nan) if entry else math.nan
        over = (j["iteration_s"] - cap) * j["iterations"]
        late_sync = sum(max(0.0, d - planned) for d in sync.get(name, [])) if not math.isnan(planned) else 0.0
        excess, by_sync, by_moves = excess + over, by_sync + late_sync, by_moves + moves.get(name, 0) * MIGRATION_S
        parts.append(f"{name} (SLO {j['slo']:.2f}) {j['iteration_s']:.0f} s vs cap {cap:.0f} s")
    if not parts:
        return "none"
    tight = sum(1 for j in per.values() if not j["slo_met"] and j["slo"] <= 1.05)
    rest = max(0.0, excess - by_sync - by_moves)
    return (f"{len(parts)} jobs, {tight} of them with SLO <= 1.05; of their {excess:,.0f} s over their caps, "
            f"late syncs on the shared link {by_sync:,.0f} s, migrations {by_moves:,.0f} s, the rest (waits for "
            f"co-runners' phases, warm switches) {rest:,.0f} s: " + "; ".join(parts))


def trace_cause(solo: TraceRun, weave: TraceRun) -> str:
    """What makes weave's saving what it is, measured on the two runs: GPU-hours held per cluster
    (the saving is the bubbles it fills), utilization, SLO attainment and the link."""
    parts = []
    for c in sorted(solo.gpu_h or {}):
        if c in (weave.gpu_h or {}) and weave.gpu_h[c] > 0:
            parts.append(f"{c} GPU-h {solo.gpu_h[c]:,.0f} -> {weave.gpu_h[c]:,.0f} ({solo.gpu_h[c] / weave.gpu_h[c]:.2f}x; "
                         f"utilization {100 * solo.util[c]:.0f}% -> {100 * weave.util[c]:.0f}%)")
    parts.append(f"SLO {100 * weave.slo:.1f}%, link load {100 * weave.link_load:.0f}% (busiest hour "
                 f"{100 * weave.link_peak:.0f}%)")
    parts.append("the paper's peaks: H800 328 -> 152 (2.16x), H20 328 -> 216 (1.52x)")
    return "; ".join(parts)


# ----- c. drift ------------------------------------------------------------------------------------------
def section_drift(args) -> list[str]:
    topo = load_topology("weave-testbed")
    jobs = trace_jobs(args.drift_jobs, args.seed + 1)
    solo = PlanningModel(topo, jobs, 0.5)
    policy = "optimal" if online_planner(topo, 0.95) is not None else "weave"
    rows, verdicts = [], []
    for template in ["none"] + [f"{k}:{m}" for k in ("increasing", "decreasing", "mixed") for m in (0.5, 1.0, 1.5)]:
        drift = None
        if template != "none":
            drift = parse_drift(template, jobs).injector(
                jobs, lambda name: jobs[name].iterations * solo.solo_iteration_s(jobs[name]))
        static = run_one("static", topo, jobs, planner_for(policy, topo, 0.95, args), share=True, seed=args.seed,
                         drift=drift, threads=args.threads, time_limit=args.time_limit)
        replanned = run_one("replan", topo, jobs, planner_for(policy, topo, 0.95, args), share=True,
                            seed=args.seed, drift=drift, replan=True, threads=args.threads,
                            time_limit=args.replan_time_limit)
        ratio = static.avg / replanned.avg if replanned.avg else math.nan
        rows.append([template, static.avg, 100 * static.slo, replanned.avg, 100 * replanned.slo, replanned.note,
                     ratio])
        say(f"  ... drift {template}: static ${static.avg:.1f}/h vs replan ${replanned.avg:.1f}/h")
    say(table(f"c. drift templates, {args.drift_jobs} Mixed jobs, {policy} admission, migration {MIGRATION_S:.0f} s "
              f"(paper: static 1.08-1.11x the cost, 95.6-98.7% SLO)",
              ["drift", "static $/h", "static SLO %", "replan $/h", "replan SLO %", "replans", "static/replan"],
              rows))
    for row in rows[1:]:
        verdicts.append(f"INFO c. {row[0]}: static/replan cost {row[6]:.2f}x, SLO static {row[2]:.1f}% vs "
                        f"replan {row[4]:.1f}%")
    say()
    return verdicts


# ----- e. fidelity ------------------------------------------------------------------------------
EXAMPLES = {
    "micro-a": ("plans/inputs/micro-a.topology.yaml", "plans/inputs/micro-a.jobs.yaml"),
    "micro-b": ("plans/inputs/micro-b.topology.yaml", "plans/inputs/micro-b.jobs.yaml"),
    "micro-c": ("plans/inputs/micro-c.topology.yaml", "plans/inputs/micro-c.jobs.yaml"),
    "seed-a100-32": ("a100-32", "plans/inputs/seed.jobs.yaml"),
    "mixed-20": ("weave-testbed", "plans/inputs/mixed-20.jobs.yaml"),
}


def section_fidelity(args) -> list[str]:
    from weave_rl.planner.plan import load_plan
    from weave_rl.profiles.jobs import load_jobs

    rows, verdicts = [], []
    for name, (topo_src, jobs_src) in EXAMPLES.items():
        topo = load_topology(topo_src)
        jobs = load_jobs(jobs_src, topo.gpu_types)
        plan = load_plan(f"plans/{name}.yaml")
        devs = []
        for rules, share in ((ElasticRules.off(), False), (ElasticRules.off(), True), (None, True)):
            r = simulate_plan(plan, topo, jobs, iterations=16, rules=rules, model=SimModel(link_sharing=share))
            per_job = metrics(r.controller, wall_s=r.wall_s, events=r.events)["per_job"]
            ratios = [j["steady_iteration_s"] / j["planned_iteration_s"] - 1 for j in per_job.values()]
            devs.append((min(ratios), max(ratios)))
        rows.append([name] + [f"{100 * lo:+.2f} .. {100 * hi:+.2f}" for lo, hi in devs])
        worst = max(abs(devs[0][0]), abs(devs[0][1]))
        verdicts.append(f"{'PASS' if worst <= 0.01 else 'FAIL'} e. {name}: simulated iteration within "
                        f"{100 * worst:.3f}% of the plan (static, unshared links)")
    say(table("e. fidelity: simulated steady-state iteration vs plan, % (min .. max over jobs)",
              ["plan", "static, unshared", "static, shared link", "elastic, shared link"], rows))
    say()
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulate", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Smaller traces (60 jobs, 12 for drift).")
    parser.add_argument("--jobs", type=int, default=200, help="Jobs in the Mixed trace of section b.")
    parser.add_argument("--drift-jobs", type=int, default=24, help="Jobs in the drift traces of section c.")
    parser.add_argument("--replan-time-limit", type=float, default=2.0, help="Solver time limit per drift replan.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--time-limit", type=float, default=10.0, help="Solver time limit per plan.")
    parser.add_argument("--sections", default="abcde", help="Which sections to run (letters).")
    # 2 h: the cheapest of 1 / 2 / 4 h on the 200-job Production trace (hourly moves jobs so often that
    # their migrations cost as much as the regrouping saves).
    parser.add_argument("--regroup-every-h", type=float, default=2.0,
                        help="Section b: the optimal policy's periodic re-optimization (also run without; 0: not run).")
    parser.add_argument("--traces", default="mixed,production-max,production-0.95",
                        help="Section b's traces: mixed, production-max, production-0.95 (comma-separated).")
    parser.add_argument("--no-capacity", action="store_true",
                        help="Section b: skip the waits on weave-testbed's capacity.")
    parser.add_argument("--snapshot-time-limit", type=float, default=5.0,
                        help="Solver time limit of each re-planning snapshot in section b.")
    args = parser.parse_args(argv)
    args.micro_iterations = 20
    if args.quick:
        args.jobs, args.drift_jobs, args.micro_iterations = min(args.jobs, 60), min(args.drift_jobs, 12), 12
    started = time.perf_counter()
    verdicts: list[str] = []
    if "a" in args.sections:
        verdicts += section_micro(args)
    main_run = None
    if "b" in args.sections or "d" in args.sections:
        v, main_run = section_trace(args)
        verdicts += v
    if "c" in args.sections:
        verdicts += section_drift(args)
    if "d" in args.sections and main_run is not None:
        ok = main_run.sim_s <= 60.0
        verdicts.append(f"{'PASS' if ok else 'FAIL'} d. {args.jobs}-job trace ({main_run.label}): simulation "
                        f"{main_run.sim_s:.1f} s ({main_run.events / main_run.sim_s:,.0f} events/s, {main_run.events:,} "
                        f"events) + planner {main_run.plan_s:.1f} s; target <= 60 s on 2 cores")
    if "e" in args.sections:
        verdicts += section_fidelity(args)
    say("Verdicts")
    for v in verdicts:
        say("  " + v)
    say(f"bench.simulate took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
