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


def run_one(label: str, topo: Topology, jobs: JobSet, planner, *, share: bool, seed: int, drift=None,
            replan: bool = False, threads: int = 2, time_limit: float = 10.0,
            link_policy: str = "deadline") -> TraceRun:
    if planner is None:
        return TraceRun(label, note="planner.online is not available yet")
    setup = None
    if replan:
        def setup(controller, _backend):
            controller.extra_drift = DriftReplanner(controller, planner, migration_cost_s=MIGRATION_S,
                                                    time_limit_s=time_limit, threads=threads)
    started = time.perf_counter()
    r = run_trace(topo, jobs, planner, seed=seed, model=SimModel(link_sharing=share, link_policy=link_policy),
                  drift=drift, threads=threads, setup=setup)
    total = time.perf_counter() - started
    m = metrics(r.controller, wall_s=r.wall_s, events=r.events, plan_iteration=False)
    log = r.extra["trace"]
    plan_s = getattr(planner, "planning_s", math.nan)
    waits = list(log.waits.values())
    replans = len(getattr(r.controller, "extra_drift", None).log) if replan else 0
    return TraceRun(label, m["avg_usd_per_hour"], m["peak_usd_per_hour"], m["slo_attainment"],
                    sum(waits) / len(waits) if waits else 0.0, len(log.never_admitted), r.events,
                    total - (plan_s if not math.isnan(plan_s) else 0.0), plan_s,
                    f"{replans} replans" if replan else "")


def planner_for(policy: str, topo: Topology, quantile, args):
    if policy == "optimal":
        return online_planner(topo, quantile)
    return BaselinePlanner(topo, policy, quantile=quantile, time_limit_s=args.time_limit, threads=args.threads)


def trace_rows(runs: list[TraceRun]) -> list[list]:
    return [[r.label, r.avg, r.peak, None if math.isnan(r.slo) else 100 * r.slo, r.wait, r.never, r.events,
             r.sim_s, r.plan_s, r.note] for r in runs]


TRACE_HEADER = ["run", "avg $/h", "peak $/h", "SLO %", "wait s", "never", "events", "sim s", "plan s", "note"]


def section_trace(args) -> tuple[list[str], TraceRun | None]:
    topo = load_topology("weave-testbed")
    jobs = trace_jobs(args.jobs, args.seed)
    verdicts = []
    runs: dict[tuple[str, bool], TraceRun] = {}
    for share in (True, False):
        for policy in POLICIES:
            runs[(policy, share)] = run_one(f"{policy} ({'shared' if share else 'unshared'} link)", topo, jobs,
                                            planner_for(policy, topo, 0.95, args), share=share, seed=args.seed,
                                            threads=args.threads, time_limit=args.time_limit)
            say(f"  ... {runs[(policy, share)].label}: {runs[(policy, share)].avg:.1f} $/h")
    say(table(f"b. {args.jobs} Mixed jobs on weave-testbed (durations +-{CV:.0%}, q=0.95)", TRACE_HEADER,
              trace_rows(list(runs.values()))))
    admission = "optimal" if not math.isnan(runs[("optimal", True)].avg) else "weave"
    quant = []
    for share in (True, False):
        q95 = runs[(admission, share)]
        qmax = run_one(f"{admission} q=max ({'shared' if share else 'unshared'} link)", topo, jobs,
                       planner_for(admission, topo, "max", args), share=share, seed=args.seed,
                       threads=args.threads, time_limit=args.time_limit)
        quant += [q95, qmax]
        ok = q95.avg < qmax.avg and q95.slo >= 0.99
        verdicts.append(f"{'PASS' if ok else 'FAIL'} b. {admission} at q=0.95 vs max ({'shared' if share else 'unshared'}"
                        f" link): ${q95.avg:.1f}/h vs ${qmax.avg:.1f}/h, SLO {100 * q95.slo:.1f}% vs "
                        f"{100 * qmax.slo:.1f}% (target: cheaper, >= 99%)")
    fair = run_one(f"{admission} q=0.95 (shared link, fair split)", topo, jobs, planner_for(admission, topo, 0.95, args),
                   share=True, seed=args.seed, threads=args.threads, time_limit=args.time_limit, link_policy="fair")
    quant.append(fair)
    say(table(f"b. planning quantile, admission policy {admission}", TRACE_HEADER, trace_rows(quant)))
    verdicts.append(f"INFO b. shared link: syncs served by least SLO slack first keep {100 * runs[(admission, True)].slo:.1f}% "
                    f"of SLOs; an even (uncoordinated) split keeps {100 * fair.slo:.1f}%")
    for share in (True, False):
        base = {p: runs[(p, share)] for p in POLICIES}
        # A policy that never admits some jobs (colocate misses their SLO) is cheaper for running less.
        complete = [r for r in base.values() if not math.isnan(r.avg) and r.never == 0]
        best = min(complete, key=lambda r: r.avg) if complete else None
        verdicts.append(f"INFO b. {'shared' if share else 'unshared'} link: time-averaged $/h " +
                        ", ".join((f"{p} {r.avg:.1f}" + (f" ({r.never} never admitted)" if r.never else ""))
                                  if not math.isnan(r.avg) else f"{p} n/a" for p, r in base.items())
                        + (f"; cheapest running every job: {best.label}" if best else ""))
    if math.isnan(runs[("optimal", True)].avg):
        verdicts.append("MISSING b. optimal-with-admission: planner/online.py does not exist yet")
    say()
    return verdicts, runs[(admission, True)]


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
