"""Planner benchmark: the ``optimal`` policy against an independent brute force and the baselines.

Run from the repository root::

    .venv/bin/python -m bench.planner [--seeds 10] [--jobs 8] [--quick]

Sections (each ends in a one-line verdict at the bottom):

a. Synthetic families BL / RH / TH / Mixed (``weave_rl.profiles.generators.generate``), seeds ``0..seeds-1``,
   ``--jobs`` jobs each, on the ``weave-testbed`` preset: the optimal cost against the exhaustive
   optimum of ``bench/bruteforce.py`` (must match on every instance, or be no dearer where the plan
   colocates a job, which the brute force does not model), and the weave and solo
   policies' cost relative to the optimum (the Weave paper reports weave within 1.01-1.12 of it).
   Every plan of every policy goes through ``weave_rl.planner.check.assert_valid``. The optimal
   policy's throughput objective (most iterations per $) against ``brute_force_throughput`` too.
b. The seed job on ``a100-32`` with the iteration-time objective: its iteration time against the
   static 20/12 split (its solo iteration) and the bound 48.75 s (all 32 GPUs on each phase, no sync,
   no switches); target: within 10 % of that bound plus sync and both warm switches.
c. Weave micro-benchmarks (paper Fig. 10 / Table 3) on topologies sized exactly to each scenario,
   for both phase splits (``paper`` and ``original``, weave_rl.profiles.generators.MICRO_SPLITS):
   $/h, $ per iteration and rejected jobs for solo / colocate / weave / optimal.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.bruteforce import BruteForceStats, brute_force_cost, brute_force_throughput
from weave_rl.planner.api import make_plan
from weave_rl.planner.check import assert_valid
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.plan import Plan
from weave_rl.planner.summary import usd_per_iteration
from weave_rl.planner.throughput import iterations_per_usd
from weave_rl.profiles.generators import MICRO_SPLITS, generate, micro_job, seed_job
from weave_rl.profiles.jobs import JobSet, jobs_from_data, jobs_to_data
from weave_rl.topology.topology import Topology, load_topology, topology_from_data

FAMILIES = ["BL", "RH", "TH", "Mixed"]
POLICIES = ["optimal", "weave", "solo", "colocate"]
PAPER_WEAVE_RANGE = (1.01, 1.12)
MATCH_TOL = 1e-6  # relative, optimal vs brute force


# ----- output -------------------------------------------------------------------------------
def table(title: str, header: list[str], rows: list[list[Any]], align: str | None = None) -> str:
    """Plain aligned text; ``align`` has one 'l' or 'r' per column (default: first left, rest right)."""
    cells = [[str(c) for c in header]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    align = align or "l" + "r" * (len(header) - 1)
    lines = [title]
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.2f}"
    return str(value)


def say(text: str = "") -> None:
    print(text, flush=True)


# ----- running a policy ---------------------------------------------------------------------
@dataclass
class Run:
    policy: str
    plan: Plan | None = None
    wall_s: float = 0.0
    error: str | None = None  # the policy raised
    violations: str | None = None  # assert_valid failed

    @property
    def ok(self) -> bool:
        return self.plan is not None and self.error is None and self.violations is None

    @property
    def cost(self) -> float:
        return self.plan.cost_usd_per_hour if self.plan else math.nan

    @property
    def rejected(self) -> int:
        return len(self.plan.rejected) if self.plan else 0

    @property
    def placed(self) -> int:
        return sum(len(g.jobs) for g in self.plan.groups) if self.plan else 0


def run_policy(topo: Topology, jobs: JobSet, policy: str, *, objective: str = "cost", time_limit_s: float = 60.0,
               threads: int = 2, max_group_size: int = 5) -> Run:
    started = time.perf_counter()
    out = Run(policy)
    try:
        out.plan = make_plan(topo, jobs, policy=policy, objective=objective, time_limit_s=time_limit_s,
                             threads=threads, max_group_size=max_group_size)
    except Exception as exc:  # a policy that crashes is reported, not fatal to the bench
        out.error = f"{type(exc).__name__}: {exc}"
    out.wall_s = time.perf_counter() - started
    if out.plan is not None:
        try:
            assert_valid(out.plan, topo, jobs)
        except AssertionError as exc:
            out.violations = str(exc)
    return out


# ----- a. synthetic families ------------------------------------------------------------------
@dataclass
class Instance:
    family: str
    seed: int
    runs: dict[str, Run]
    brute: float
    brute_wall_s: float
    brute_stats: BruteForceStats
    brute_groups: list = field(default_factory=list)
    throughput: Run | None = None  # the optimal policy, throughput objective
    brute_throughput: float = math.nan  # exhaustive iterations per $

    @property
    def throughput_match(self) -> bool:
        t = self.throughput
        return t is not None and t.ok and not t.rejected and math.isclose(
            iterations_per_usd(t.plan), self.brute_throughput, rel_tol=MATCH_TOL)

    @property
    def opt(self) -> Run:
        return self.runs["optimal"]

    @property
    def match(self) -> bool:
        """The brute force's optimum; no dearer where the plan colocates a job (its rollout and
        train on the same GPUs), which the brute force does not model (tests/test_bruteforce.py)."""
        if not self.opt.ok or self.opt.rejected:
            return False
        if self.colocates:
            return self.opt.cost <= self.brute * (1 + MATCH_TOL)
        return math.isclose(self.opt.cost, self.brute, rel_tol=MATCH_TOL)

    @property
    def colocates(self) -> bool:
        return any(set(j.phase("rollout").gpus) == set(j.phase("train").gpus)
                   for g in self.opt.plan.groups for j in g.jobs)

    def ratio(self, policy: str) -> float:
        run = self.runs[policy]
        if not run.ok or run.rejected or not self.opt.ok or self.opt.cost <= 0:
            return math.nan
        return run.cost / self.opt.cost


def section_families(args: argparse.Namespace) -> tuple[list[Instance], list[str]]:
    topo = load_topology("weave-testbed")
    instances: list[Instance] = []
    notes: list[str] = []
    colo_reasons: dict[str, int] = {}
    for family in FAMILIES:
        rows = []
        for seed in range(args.seeds):
            jobs = generate(family, args.jobs, seed)
            runs = {p: run_policy(topo, jobs, p, time_limit_s=args.time_limit, threads=args.threads,
                                  max_group_size=args.max_group_size) for p in POLICIES}
            stats = BruteForceStats()
            started = time.perf_counter()
            brute, groups = brute_force_cost(PlanningModel(topo, jobs), args.max_group_size, threads=args.threads,
                                             stats=stats)
            inst = Instance(family, seed, runs, brute, time.perf_counter() - started, stats, groups)
            inst.throughput = run_policy(topo, jobs, "optimal", objective="throughput", time_limit_s=args.time_limit,
                                         threads=args.threads, max_group_size=args.max_group_size)
            inst.brute_throughput, _ = brute_force_throughput(PlanningModel(topo, jobs), args.max_group_size,
                                                              threads=args.threads)
            if not inst.throughput_match:
                t = inst.throughput
                notes.append(f"{family} seed {seed}: throughput objective "
                             f"{iterations_per_usd(t.plan) if t.plan else math.nan:.6f} != brute force "
                             f"{inst.brute_throughput:.6f} iterations per $ ({t.error or t.violations or ''})")
            instances.append(inst)
            opt = inst.opt
            colo = runs["colocate"]
            rows.append([
                family, seed, opt.cost, brute,
                (opt.cost / brute) if brute else math.nan,
                inst.ratio("weave"), inst.ratio("solo"),
                ("ERR" if not colo.ok else f"{colo.rejected} rej" if colo.rejected else inst.ratio("colocate")),
                len(opt.plan.groups) if opt.plan else "-",
                opt.plan.solver.status if opt.plan else "ERR",
                f"{opt.wall_s:.2f}", f"{inst.brute_wall_s:.2f}",
                stats.timetable_solves,
                iterations_per_usd(inst.throughput.plan) if inst.throughput.plan else math.nan,
                "yes" if inst.throughput_match else "NO",
                "yes" if all(r.ok for r in runs.values()) and inst.throughput.ok else "NO",
            ])
            for r in runs.values():
                if r.error:
                    notes.append(f"{family} seed {seed} {r.policy}: raised {r.error}")
                if r.violations:
                    notes.append(f"{family} seed {seed} {r.policy}: INVALID plan:\n{r.violations}")
            if not inst.match:
                notes.append(f"{family} seed {seed}: optimal {opt.cost:.2f} != brute force {brute:.2f} "
                             f"(optimal groups {[[j.name for j in g.jobs] for g in opt.plan.groups] if opt.plan else '-'}; "
                             f"brute-force groups {groups})")
            if stats.unknown:
                notes.append(f"{family} seed {seed}: brute-force timetable solves hit the time limit: {stats.unknown}")
            for x in (colo.plan.rejected if colo.plan else []):
                key = re.sub(r"\d+(\.\d+)?", "#", x.reason.replace(x.name, "<job>"))
                colo_reasons[key] = colo_reasons.get(key, 0) + 1
            for p in ("weave", "solo"):
                if runs[p].ok and runs[p].rejected:
                    notes.append(f"{family} seed {seed} {p}: rejected {runs[p].rejected} job(s): "
                                 + "; ".join(f"{x.name}: {x.reason}" for x in runs[p].plan.rejected))
        say(table(f"a. {family}: {args.jobs} jobs on weave-testbed, $/h (ratios to the optimum)",
                  ["family", "seed", "opt $/h", "brute $/h", "opt/bf", "weave/opt", "solo/opt", "colo/opt",
                   "groups", "status", "opt s", "bf s", "bf tt", "iter/$", "iter/$ == bf", "valid"], rows))
        say()
    if colo_reasons:
        notes.append("colocate rejections in a.: " + "; ".join(f"{n} x {r}" for r, n in sorted(colo_reasons.items())))
    # Per-family summary.
    rows = []
    for family in FAMILIES:
        fam = [i for i in instances if i.family == family]
        weave = [i.ratio("weave") for i in fam if not math.isnan(i.ratio("weave"))]
        solo = [i.ratio("solo") for i in fam if not math.isnan(i.ratio("solo"))]
        colo = [i.ratio("colocate") for i in fam if not math.isnan(i.ratio("colocate"))]
        walls = [i.opt.wall_s for i in fam]
        rows.append([family, len(fam),
                     statistics.fmean(weave) if weave else math.nan, max(weave) if weave else math.nan,
                     statistics.fmean(solo) if solo else math.nan,
                     f"{statistics.fmean(colo):.2f} ({len(colo)})" if colo else "-",
                     sum(i.runs["colocate"].rejected for i in fam),
                     f"{sum(i.match for i in fam)}/{len(fam)}",
                     statistics.fmean(walls), max(walls),
                     statistics.fmean(i.brute_wall_s for i in fam)])
    say(table("a. summary per family (weave/opt: the paper reports 1.01-1.12)",
              ["family", "n", "weave/opt mean", "weave/opt max", "solo/opt mean", "colo/opt mean (n)", "colo rej", "opt == bf",
               "opt s mean", "opt s max", "bf s mean"], rows))
    return instances, notes


# ----- b. the seed job ----------------------------------------------------------------------
@dataclass
class SeedResult:
    iteration_s: float
    solo_s: float
    bound_s: float
    reference_s: float  # bound + sync + switches
    run: Run


def section_seed(args: argparse.Namespace) -> SeedResult | None:
    topo = load_topology("a100-32")
    job = seed_job()
    jobs = JobSet(jobs=[job])
    model = PlanningModel(topo, jobs)
    solo = model.solo[job.name]
    gpus = topo.gpus_in()
    n = len(gpus)
    roll_all = model.duration(job, "rollout", n, "A100")
    train_all = model.duration(job, "train", n, "A100")
    bound = roll_all + train_all
    sync = model.sync_s(job, gpus, gpus)
    switches = model.max_switch_s(job, "rollout", gpus) + model.max_switch_s(job, "train", gpus)
    reference = bound + sync + switches
    run = run_policy(topo, jobs, "optimal", objective="iteration-time", time_limit_s=args.time_limit,
                     threads=args.threads)
    if run.plan is None or not run.plan.groups:
        say(f"b. seed job: optimal (iteration-time) failed: {run.error or 'no group'}")
        return None
    jp = run.plan.groups[0].jobs[0]
    it = jp.iteration_s
    shape = ", ".join(f"{s.phase} {len(s.gpus)} GPUs @ {s.start_s:.2f}+{s.duration_s:.2f}" for s in jp.phases)
    rows = [
        ["plan (iteration-time objective)", it, "", ""],
        ["static 20/12 split (solo)", solo, solo / it, it / solo],
        ["bound: 32 GPUs each phase, no sync/switch", bound, bound / it, it / bound],
        ["bound + sync + both warm switches", reference, reference / it, it / reference],
    ]
    say(table(f"b. seed job on a100-32: {shape}; status {run.plan.solver.status}, {run.wall_s:.2f} s, "
              f"valid {'yes' if run.ok else 'NO'}",
              ["", "iteration s", "x / plan", "plan / x"], rows, align="lrrr"))
    say(f"   sync {sync:.3f} s, warm switches {switches:.3f} s (rollout + train state over PCIe); "
        f"speed-up over the static split {solo / it:.2f}x; plan / 48.75 = {it / bound:.3f}")
    if run.violations:
        say(f"   INVALID plan:\n{run.violations}")
    return SeedResult(it, solo, bound, reference, run)


# ----- c. micro-benchmarks -------------------------------------------------------------------
def micro_topology(name: str, rollout_nodes: int, train_nodes: int) -> Topology:
    return topology_from_data({
        "name": name,
        "clusters": [
            {"name": "rollout", "gpu_type": "H20", "nodes": rollout_nodes, "gpus_per_node": 8, "host_mem_gb": 2048},
            {"name": "train", "gpu_type": "H800", "nodes": train_nodes, "gpus_per_node": 8, "host_mem_gb": 2048},
        ],
        "links": [{"between": ["rollout", "train"], "gbps": 20, "latency_ms": 1}],
    }, f"<{name}>")


def micro_jobs(types: list[str], train_options: dict[str, list[int]] | None = None, split: str = "paper") -> JobSet:
    """A scenario's jobs with the phase split ``split`` (``MICRO_SPLITS`` in weave_rl.profiles.generators:
    ``paper``, derived from the paper's configurations, or ``original``, the first reading)."""
    counts: dict[str, int] = {}
    jobs = []
    for t in types:
        counts[t] = counts.get(t, 0) + 1
        jobs.append(micro_job(t, f"{t}{counts[t]}", split=split))
    data = jobs_to_data(JobSet(jobs=jobs))
    for raw, t in zip(data["jobs"], types):
        if train_options and t in train_options:
            raw["train"]["gpu_options"] = list(train_options[t])
    return jobs_from_data(data, "<micro>")


MICRO = [
    ("a", "2 x A on 8 H800 + 8 H20", ["A", "A"], 1, 1, None),
    ("b", "2 x D + 1 x E on 8 H800 + 24 H20", ["D", "D", "E"], 3, 1, None),
    ("c", "1 x C + 2 x D on 16 H800 + 16 H20", ["C", "D", "D"], 2, 2, {"D": [8, 16]}),
]


def section_micro(args: argparse.Namespace) -> tuple[dict[str, dict[str, Run]], list[str]]:
    results: dict[str, dict[str, Run]] = {}
    notes: list[str] = []
    for (key, title, types, n_roll, n_train, options), split in ((m, s) for s in MICRO_SPLITS for m in MICRO):
        topo = micro_topology(f"micro-{key}", n_roll, n_train)
        jobs = micro_jobs(types, options, split)
        title = f"{title}, {split} split"
        key = f"{key}/{split}"
        runs = {p: run_policy(topo, jobs, p, time_limit_s=args.time_limit, threads=args.threads,
                              max_group_size=args.max_group_size) for p in POLICIES}
        results[key] = runs
        rows = []
        for p, r in runs.items():
            if r.plan is None:
                rows.append([p, "ERR", "-", "-", "-", "-", "-", r.error[:60] if r.error else ""])
                continue
            placed_iter = usd_per_iteration(r.plan) if r.placed else math.nan
            groups = "; ".join("+".join(j.name for j in g.jobs) + f" @{g.cycle_s:.0f}s" for g in r.plan.groups)
            reasons = sorted({x.reason.split(":")[0][:40] for x in r.plan.rejected})
            rows.append([p, r.cost, placed_iter, f"{r.placed}/{len(jobs)}", r.rejected,
                         "yes" if r.ok else "NO", groups or "-", "; ".join(reasons)])
            if r.violations:
                notes.append(f"micro ({key}) {p}: INVALID plan:\n{r.violations}")
            for x in r.plan.rejected:
                notes.append(f"micro ({key}) {p}: rejected {x.name}: {x.reason}")
            if r.plan.solver.note:
                notes.append(f"micro ({key}) {p}: solver note: {r.plan.solver.note}")
        say(table(f"c. micro ({key}) {title}", ["policy", "$/h", "$/iter", "placed", "rejected", "valid",
                                                  "groups (cycle)", "rejection"], rows, align="lrrrrlll"))
        # The same jobs with room for every policy (weave-testbed), so that each one's $ per
        # iteration covers all jobs.
        roomy = load_topology("weave-testbed")
        roomy_rows = []
        for p in POLICIES:
            r = run_policy(roomy, jobs, p, time_limit_s=args.time_limit, threads=args.threads,
                           max_group_size=args.max_group_size)
            if r.plan is None or r.violations:
                roomy_rows.append([p, "ERR", "-", "-"])
                continue
            roomy_rows.append([p, r.cost, usd_per_iteration(r.plan), f"{r.placed}/{len(jobs)}"])
        say(table(f"c. micro ({key}) on weave-testbed (room for every policy)", ["policy", "$/h", "$/iter", "placed"],
                  roomy_rows, align="lrrr"))
        say()
    return results, notes


# ----- main ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.planner", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 per family (default 10)")
    parser.add_argument("--jobs", type=int, default=8, help="jobs per instance (default 8)")
    parser.add_argument("--quick", action="store_true", help="3 seeds")
    parser.add_argument("--time-limit", type=float, default=60.0, help="planner time limit, seconds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-group-size", type=int, default=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds = min(args.seeds, 3)
    started = time.perf_counter()

    instances, notes_a = section_families(args)
    say()
    seed = section_seed(args)
    say()
    micro, notes_c = section_micro(args)

    notes = notes_a + notes_c
    if notes:
        say("notes:")
        for n in notes:
            say("  " + n.replace("\n", "\n    "))
        say()

    verdicts: list[tuple[bool, str]] = []
    matched = sum(i.match for i in instances)
    verdicts.append((matched == len(instances),
                     f"a. optimal == brute force on {matched}/{len(instances)} instances ("
                     f"<= where it colocates a job, which the brute force does not model: "
                     f"{sum(i.colocates for i in instances if i.opt.ok)})"))
    matched = sum(i.throughput_match for i in instances)
    verdicts.append((matched == len(instances),
                     f"a. throughput objective == brute force (iterations per $) on {matched}/{len(instances)} instances"))
    valid = [r.ok for i in instances for r in i.runs.values()]
    verdicts.append((all(valid), f"a. plans valid (assert_valid) {sum(valid)}/{len(valid)} "
                                 f"({len(POLICIES)} policies x {len(instances)} instances)"))
    means = {f: statistics.fmean(r) for f in FAMILIES
             if (r := [x for i in instances if i.family == f and not math.isnan(x := i.ratio("weave"))])}
    # The issue asks for weave/opt to be reported (the paper: 1.01-1.12); the target is that the
    # optimum is never beaten by weave.
    ratios = [x for i in instances if not math.isnan(x := i.ratio("weave"))]
    verdicts.append((all(r >= 1.0 - 1e-9 for r in ratios),
                     f"a. optimal <= weave on {sum(r >= 1.0 - 1e-9 for r in ratios)}/{len(ratios)} instances; "
                     "weave/opt family means " + ", ".join(f"{f} {m:.3f}" for f, m in means.items())
                     + f" (reported; the paper's Weave is {PAPER_WEAVE_RANGE[0]:.2f}-{PAPER_WEAVE_RANGE[1]:.2f}"
                       " of its brute force)"))
    if seed is None:
        verdicts.append((False, "b. seed job: no iteration-time plan"))
    else:
        ok = seed.run.ok and seed.iteration_s <= 1.10 * seed.reference_s
        verdicts.append((ok, f"b. seed job iteration {seed.iteration_s:.2f} s = {seed.iteration_s / seed.bound_s:.3f} "
                             f"x 48.75 s bound, {seed.iteration_s / seed.reference_s:.3f} x (bound + sync + switches "
                             f"{seed.reference_s:.2f} s; target <= 1.10), {seed.solo_s / seed.iteration_s:.2f}x faster "
                             f"than the static 20/12 split ({seed.solo_s:.2f} s)"))
    for key, runs in micro.items():
        opt = runs["optimal"]
        n = opt.placed + opt.rejected
        full = opt.ok and not opt.rejected
        cheapest = full and all(not r.ok or r.rejected or opt.cost <= r.cost + 1e-6 for r in runs.values())
        others = ", ".join(
            f"{p} {r.placed}/{n}" + (f" ${usd_per_iteration(r.plan):.3f}/iter" if r.placed else "") if r.plan
            else f"{p} ERR" for p, r in runs.items() if p != "optimal")
        verdicts.append((cheapest and all(r.ok for r in runs.values()),
                         f"c. micro ({key}): optimal places {opt.placed}/{n} at ${opt.cost:.2f}/h "
                         + (f"${usd_per_iteration(opt.plan):.3f}/iter" if opt.placed else "")
                         + f"; {others} (target: optimal places all, cheapest full plan, every plan valid)"))
    say(f"verdicts (total {time.perf_counter() - started:.0f} s):")
    for ok, text in verdicts:
        say(f"  {'PASS' if ok else 'FAIL'}  {text}")
    return 0 if all(ok for ok, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
