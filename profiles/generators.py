"""Reference workloads: Weave's micro-benchmark jobs, its synthetic trace families, the seed job.

Host memory per 8-GPU node comes from Weave Table 2 (with RollMux's 3B column), in GB:

=====  =======  =====
size   rollout  train
=====  =======  =====
3B     113.4    156.2
7B     275.7    240.0
14B    445.4    456.1
32B    490.3    520.4
=====  =======  =====

Micro-benchmark types (Weave Table 3; rollout on H20, train on H800). The paper gives iteration
times, not phase times, so the phase splits are ours, in two named variants (``MICRO_SPLITS``):

``paper`` (what the benches use): derived so that the paper's stated configurations are feasible
and tight in *this* model (its sync and warm-switch times on weave-testbed: 7B sync 5.63 s, 8B
6.44 s, 14B 11.26 s, 32B 16 -> 16 26.38 s; switches 0.9-2.0 s). Every job of a scenario has the
scenario's Table 4 Solo-D iteration (the paper lists one per scenario), the stated rollout/train
ratios hold, and the split puts each scenario's Gantt pairing at its lower bound:

====  =======  =======  ======  ===================================================================
type  rollout  train    solo s  derivation
====  =======  =======  ======  ===================================================================
A     126.0    126.1    257.7   (a): r + t = 257.7 - sync; both pools equally loaded by two A's
                                (r + switch_r = t + switch_t); with the paper's own 0.9 s sync and
                                0.9 / 4.1 s warm switches that rule gives exactly Table 4's 261.8 s
B     230.0    220.0    461.3   no scenario uses it: as ``original``
C     163.4    384.8    574.6   (c): r + t = 574.6 - sync; D's rollout runs in C's train and the two
                                D trains (16 H800 each) in C's rollout, both pools equally loaded
                                (537 s of 574.6 on every node)
D     370.7    148.3    525.4   (b): T_roll = 2.5 T_train (paper), solo = Table 4's (b) 525.4 s
E     440.7    73.4     525.4   (b): T_roll = 6 T_train (paper), solo 525.4 s
====  =======  =======  ======  ===================================================================

``original`` (``micro_job``'s default, the committed example plans ``plans/micro-*.yaml``): Table 4's
solo iteration minus the Fig. 13 Weave sync time, divided by the rollout/train ratio the paper
states where it states one (A 140.0 + 116.8, B 230 + 220, C 290 + 272.3 at ~52/48, D 300 + 120,
E 448.9 + 74.8). In this model its solos are 262.4 / 461.3 / 588.7 / 426.4 / 535.0 s, and D's
300 s rollout is longer than C's 272 s train, so D cannot pair with C as the paper's Gantt shows.

D uses the 7B memory row (an 8B model), E the 14B row. Micro jobs have SLO 1.5.

Synthetic families (Weave Table 6, seconds, rollout / train, each Unif(lo, hi)): BL, RH, TH draw a
size S/M/L per job; Mixed draws one of the nine (family, size) pairs. Every synthetic job: 8 H20
rollout + 8 H800 train GPUs, model size from {3, 7, 14, 32}B, SLO ~ Unif(1, 2) (2 decimals),
iterations ~ Unif{50..300}, arrivals with exponential gaps of mean 1800 s from 0 (0.1 s),
durations rounded to 0.1 s. Everything is drawn from ``numpy.random.default_rng(seed)``.

Hetero (``_hetero``): the synthetic families' timing on shapes closer to real clusters; see its
docstring.
"""

from __future__ import annotations

import numpy as np

from weave_rl.profiles.jobs import JobSet, JobSpec

FAMILIES = ["micro", "BL", "RH", "TH", "Mixed", "seed", "Production", "Hetero"]

# size (B params) -> (rollout, train) host memory per 8-GPU node, GB.
HOST_MEM_GB = {3: (113.4, 156.2), 7: (275.7, 240.0), 14: (445.4, 456.1), 32: (490.3, 520.4)}
MODEL_SIZES = [3, 7, 14, 32]

# type -> (params_b, memory row, rollout gpus, train gpus, rollout s, train s), the original split.
MICRO_TYPES = {
    "A": (7, 7, 8, 8, 140.0, 116.8),
    "B": (14, 14, 8, 8, 230.0, 220.0),
    "C": (32, 32, 16, 16, 290.0, 272.3),
    "D": (8, 7, 8, 8, 300.0, 120.0),
    "E": (14, 14, 8, 8, 448.9, 74.8),
}
# split -> type -> (rollout s, train s); see the module docstring for how each was derived.
MICRO_SPLITS = {
    "paper": {"A": (126.0, 126.1), "B": (230.0, 220.0), "C": (163.4, 384.8), "D": (370.7, 148.3),
              "E": (440.7, 73.4)},
    "original": {t: v[4:] for t, v in MICRO_TYPES.items()},
}

# family -> size -> ((rollout lo, hi), (train lo, hi)), seconds.
SYNTHETIC = {
    "BL": {"S": ((50, 100), (50, 100)), "M": ((100, 200), (100, 200)), "L": ((200, 300), (200, 300))},
    "RH": {"S": ((100, 200), (25, 50)), "M": ((200, 400), (50, 100)), "L": ((400, 600), (100, 200))},
    "TH": {"S": ((25, 50), (100, 200)), "M": ((50, 100), (200, 400)), "L": ((100, 200), (400, 600))},
}
SIZES = ["S", "M", "L"]
MEAN_ARRIVAL_GAP_S = 1800.0

SEED_GPU_OPTIONS = [4, 8, 12, 16, 20, 24, 28, 32]


def generate(family: str, count: int, seed: int) -> JobSet:
    """``count`` jobs of ``family`` (one of ``FAMILIES``, any case), the same for the same seed."""
    canonical = {f.lower(): f for f in FAMILIES}.get(str(family).lower())
    if canonical is None:
        raise ValueError(f"unknown workload family {family!r} (known: {', '.join(FAMILIES)})")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if canonical == "micro":
        letters = list(MICRO_TYPES)
        return JobSet(jobs=[micro_job(letters[i % 5], f"micro-{i:03d}") for i in range(count)])
    if canonical == "seed":
        return JobSet(jobs=[seed_job(f"seed-{i}") for i in range(count)])
    if canonical == "Production":
        return JobSet(jobs=_production(count, np.random.default_rng(seed)))
    if canonical == "Hetero":
        return JobSet(jobs=_hetero(count, np.random.default_rng(seed)))
    return JobSet(jobs=_synthetic(canonical, count, np.random.default_rng(seed)))


def micro_job(type_letter: str, name: str | None = None, split: str = "original") -> JobSpec:
    """Weave micro-benchmark job of type A-E with the phase split ``split`` (``MICRO_SPLITS``; see
    the module docstring for the numbers)."""
    letter = type_letter.upper()
    if letter not in MICRO_TYPES:
        raise ValueError(f"unknown micro-benchmark type {type_letter!r} (known: {', '.join(MICRO_TYPES)})")
    if split not in MICRO_SPLITS:
        raise ValueError(f"unknown micro-benchmark split {split!r} (known: {', '.join(MICRO_SPLITS)})")
    params_b, mem_row, roll_gpus, train_gpus, _, _ = MICRO_TYPES[letter]
    roll_s, train_s = MICRO_SPLITS[split][letter]
    roll_mem, train_mem = HOST_MEM_GB[mem_row]
    return JobSpec(
        name=name or letter,
        params_b=params_b,
        slo=1.5,
        rollout={"gpus": roll_gpus, "gpu_type": "H20", "duration_s": roll_s, "host_mem_gb": roll_mem},
        train={"gpus": train_gpus, "gpu_type": "H800", "duration_s": train_s, "host_mem_gb": train_mem},
    )


def seed_job(name: str = "seed-0") -> JobSpec:
    """The seed article's single 7B job on 32 A100: rollout 60 s on 20, train 30 s on 12.

    Both phases may use any multiple of 4 of the 32 GPUs (``gpu_options``).
    """
    roll_mem, train_mem = HOST_MEM_GB[7]
    common = {"gpu_type": "A100", "gpu_types": ["A100"], "gpu_options": SEED_GPU_OPTIONS}
    return JobSpec(
        name=name,
        params_b=7,
        slo=2.0,
        rollout={"gpus": 20, "duration_s": 60.0, "host_mem_gb": roll_mem, **common},
        train={"gpus": 12, "duration_s": 30.0, "host_mem_gb": train_mem, **common},
    )


def _synthetic(family: str, count: int, rng: np.random.Generator) -> list[JobSpec]:
    jobs = []
    arrival = 0.0
    for i in range(count):
        if family == "Mixed":
            pick = int(rng.integers(9))
            kind, size = list(SYNTHETIC)[pick // 3], SIZES[pick % 3]
        else:
            kind, size = family, SIZES[int(rng.integers(3))]
        (r_lo, r_hi), (t_lo, t_hi) = SYNTHETIC[kind][size]
        rollout_s = round(float(rng.uniform(r_lo, r_hi)), 1)
        train_s = round(float(rng.uniform(t_lo, t_hi)), 1)
        model = MODEL_SIZES[int(rng.integers(len(MODEL_SIZES)))]
        slo = round(float(rng.uniform(1.0, 2.0)), 2)
        iterations = int(rng.integers(50, 301))
        if i > 0:
            arrival += float(rng.exponential(MEAN_ARRIVAL_GAP_S))
        roll_mem, train_mem = HOST_MEM_GB[model]
        jobs.append(
            JobSpec(
                name=f"{family.lower()}-{i:03d}",
                params_b=model,
                slo=slo,
                iterations=iterations,
                arrival_s=round(arrival, 1),
                rollout={"gpus": 8, "gpu_type": "H20", "duration_s": rollout_s, "host_mem_gb": roll_mem},
                train={"gpus": 8, "gpu_type": "H800", "duration_s": train_s, "host_mem_gb": train_mem},
            )
        )
    return jobs


# ----- Production: the statistics of the paper's 200-job testbed trace (Weave 6.5) ------------------
PRODUCTION_GAP_S = 370.2 * 3600 / 200  # 6,664 s: 200 arrivals over the 370.2-hour trace (~1.85 h)
PRODUCTION_HOURS = (2.0, 53.8)  # job length, Unif: mean 27.9 h
PRODUCTION_LENGTHS_K = ([4, 8, 16, 32], [0.30, 0.34, 0.21, 0.15])  # max response length: mean 12.1k
PRODUCTION_MULTI_TURN = 0.3  # share of multi-turn (agentic) jobs: rollout 3-4x their training
# size -> (rollout s, train s) at 8K max tokens on the size's GPUs (7B, 14B, 32B: micro types A, B, C;
# 3B scaled from 7B), and (rollout GPUs, train GPUs): 32B jobs take 16 + 16 (Type-C).
PRODUCTION_BASE = {3: ((80.0, 60.0), (8, 8)), 7: ((140.0, 116.8), (8, 8)), 14: ((230.0, 220.0), (8, 8)),
                   32: ((290.0, 272.3), (16, 16))}
# Worst-case (max-token) durations are what Weave plans on; typical iterations are shorter:
# p50 / p95 as shares of the max, per phase (rollout varies with response length more than train).
PRODUCTION_SHARES = {"rollout": (0.65, 0.9), "train": (0.75, 0.92)}


def _production(count: int, rng: np.random.Generator) -> list[JobSpec]:
    """Jobs with the statistics Weave 6.5 gives for its testbed trace: Poisson arrivals of mean gap
    370.2 h / 200, lengths Unif(2, 53.8) h (mean 27.9 h; iterations = length / p50 solo, at least
    5), 3B-32B (uniform), max response length 4k/8k/16k/32k (mean 12.1k), 30 % multi-turn
    (rollout x 3), 32B and multi-turn 14B jobs on more than 8 + 8 GPUs (16 + 16, and 16 H20 + 8 H800),
    SLO ~ Unif(1, 2). Phase durations at the max token limit scale linearly with it from
    ``PRODUCTION_BASE`` times Unif(0.8, 1.25), given as ``{p50, p95, max}`` (``PRODUCTION_SHARES``),
    so ``--quantile max`` is Weave's worst-case planning."""
    jobs = []
    arrival = 0.0
    lengths, weights = PRODUCTION_LENGTHS_K
    for i in range(count):
        model = MODEL_SIZES[int(rng.integers(len(MODEL_SIZES)))]
        length_k = int(rng.choice(lengths, p=weights))
        multi = bool(rng.random() < PRODUCTION_MULTI_TURN)
        (roll8, train8), (roll_gpus, train_gpus) = PRODUCTION_BASE[model]
        if multi and model == 14:
            roll_gpus = 16
        scale = length_k / 8
        rollout_max = roll8 * scale * (3.0 if multi else 1.0) * float(rng.uniform(0.8, 1.25)) * 8 / roll_gpus \
            * (2 if model == 32 else 1)  # the base of 32B is already on 16 GPUs
        train_max = train8 * scale * float(rng.uniform(0.8, 1.25))
        slo = round(float(rng.uniform(1.0, 2.0)), 2)
        hours = float(rng.uniform(*PRODUCTION_HOURS))
        if i > 0:
            arrival += float(rng.exponential(PRODUCTION_GAP_S))
        phases = {}
        for kind, worst, gpus, gpu_type in (("rollout", rollout_max, roll_gpus, "H20"),
                                            ("train", train_max, train_gpus, "H800")):
            p50, p95 = PRODUCTION_SHARES[kind]
            worst = round(worst, 1)
            phases[kind] = {"gpus": gpus, "gpu_type": gpu_type,
                            "duration_s": {"p50": round(p50 * worst, 1), "p95": round(p95 * worst, 1), "max": worst},
                            "host_mem_gb": HOST_MEM_GB[model][0 if kind == "rollout" else 1]}
        typical = phases["rollout"]["duration_s"]["p50"] + phases["train"]["duration_s"]["p50"]
        jobs.append(JobSpec(name=f"production-{i:03d}", params_b=model, slo=slo,
                            iterations=max(5, int(round(hours * 3600 / typical))), arrival_s=round(arrival, 1),
                            **phases))
    return jobs


# ----- Hetero: mixed job shapes, flexible training widths, rollout that may run on H800 --------------
# (rollout GPUs, train GPUs) -> model sizes (B) drawn for that shape; ``HETERO_SHAPE_DRAW`` lists the
# shapes equally likely, so half the jobs are 8 + 8 and a sixth each 16 + 16, 16 + 8, 32 + 16.
HETERO_SHAPES = {(8, 8): (7, 14), (16, 16): (14, 32), (16, 8): (14, 32), (32, 16): (32, 70)}
HETERO_SHAPE_DRAW = [(8, 8), (8, 8), (8, 8), (16, 16), (16, 8), (32, 16)]
# Host memory per 8-GPU node, GB: ``HOST_MEM_GB`` plus Weave Table 2's 70B column (TP8 / TP8PP4).
HETERO_HOST_MEM_GB = {**HOST_MEM_GB, 70: (391.2, 458.7)}
HETERO_FLEX_TRAIN_SHARE = 0.25  # jobs up to HETERO_FLEX_MAX_B whose training may use 8 or 16 GPUs
HETERO_FLEX_MAX_B = 32  # a 70B model's training state does not fit 8 H800
HETERO_FLEX_TRAIN_GPUS = (8, 16)
HETERO_H800_ROLLOUT_SHARE = 0.2  # jobs whose rollout may also run on H800 (gpu_types [H20, H800])


def _hetero(count: int, rng: np.random.Generator) -> list[JobSpec]:
    """Jobs with the shapes of a shared production cluster rather than the paper's uniform 8 + 8:

    - shape: 8 + 8 GPUs (rollout H20 + train H800) for half the jobs, 16 + 16, 16 + 8 (rollout-heavy
      serving of a larger model) and 32 + 16 for a sixth each (``HETERO_SHAPE_DRAW``);
    - model: one of the shape's two sizes (``HETERO_SHAPES``, 7B-70B), host memory per node from
      Weave Table 2 (``HETERO_HOST_MEM_GB``);
    - phase times: one of Mixed's nine Table 6 (family, size) pairs, Unif(lo, hi) each, at the job's
      own GPU counts (larger models get more GPUs, so iterations stay in the paper's ranges); other
      counts and types follow ``PhaseSpec.duration_at`` (linear in 1/gpus, speed ratio of the types);
    - ``HETERO_FLEX_TRAIN_SHARE`` of the jobs up to 32B may train on 8 or 16 GPUs (``gpu_options``,
      reference point unchanged), ``HETERO_H800_ROLLOUT_SHARE`` may roll out on H800 as well;
    - SLO, iterations and arrivals as the synthetic families (Unif(1, 2), Unif{50..300}, exponential
      gaps of mean ``MEAN_ARRIVAL_GAP_S``).

    Its own draws from ``rng``: no other family's output depends on this code."""
    jobs = []
    arrival = 0.0
    for i in range(count):
        roll_gpus, train_gpus = HETERO_SHAPE_DRAW[int(rng.integers(len(HETERO_SHAPE_DRAW)))]
        model = HETERO_SHAPES[(roll_gpus, train_gpus)][int(rng.integers(2))]
        pick = int(rng.integers(9))
        (r_lo, r_hi), (t_lo, t_hi) = SYNTHETIC[list(SYNTHETIC)[pick // 3]][SIZES[pick % 3]]
        rollout_s = round(float(rng.uniform(r_lo, r_hi)), 1)
        train_s = round(float(rng.uniform(t_lo, t_hi)), 1)
        flex = bool(rng.random() < HETERO_FLEX_TRAIN_SHARE) and model <= HETERO_FLEX_MAX_B
        h800_rollout = bool(rng.random() < HETERO_H800_ROLLOUT_SHARE)
        slo = round(float(rng.uniform(1.0, 2.0)), 2)
        iterations = int(rng.integers(50, 301))
        if i > 0:
            arrival += float(rng.exponential(MEAN_ARRIVAL_GAP_S))
        roll_mem, train_mem = HETERO_HOST_MEM_GB[model]
        rollout = {"gpus": roll_gpus, "gpu_type": "H20", "duration_s": rollout_s, "host_mem_gb": roll_mem}
        if h800_rollout:
            rollout["gpu_types"] = ["H20", "H800"]
        train = {"gpus": train_gpus, "gpu_type": "H800", "duration_s": train_s, "host_mem_gb": train_mem}
        if flex:
            train["gpu_options"] = list(HETERO_FLEX_TRAIN_GPUS)
        jobs.append(JobSpec(name=f"hetero-{i:03d}", params_b=model, slo=slo, iterations=iterations,
                            arrival_s=round(arrival, 1), rollout=rollout, train=train))
    return jobs
