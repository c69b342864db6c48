"""Tests for profiles/: duration models, jobs YAML, records, fitting, workload generators.

Expected numbers are worked out by hand in the comments.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from weave_rl.profiles.durations import Duration, parse_quantile
from weave_rl.profiles.fit import fit_jobs
from weave_rl.profiles.generators import FAMILIES, HOST_MEM_GB, SYNTHETIC, generate, micro_job, seed_job
from weave_rl.profiles.jobs import JobSet, JobSpec, Scaling, jobs_from_data, jobs_to_data, load_jobs, save_jobs
from weave_rl.profiles.records import RECORD_COLUMNS, read_records, records_frame, write_records
from weave_rl.core.errors import InputError

# --- durations -------------------------------------------------------------------------------


def test_constant_duration():
    d = Duration.parse(120)
    assert d.kind == "constant"
    assert d.quantile(0.5) == d.quantile(0.95) == d.quantile("max") == d.mean() == 120.0
    assert d.sample(np.random.default_rng(0)) == 120.0
    assert d.to_raw() == 120


def test_samples_duration():
    d = Duration.parse({"samples": [10, 20, 30, 40]})
    assert d.quantile(0.5) == 25.0  # halfway between 20 and 30
    assert d.quantile(0.95) == pytest.approx(38.5)  # position 0.95 * 3 = 2.85: 30 + 0.85 * 10
    assert d.quantile("max") == d.quantile(1.0) == 40.0
    assert d.mean() == 25.0
    rng = np.random.default_rng(1)
    assert {d.sample(rng) for _ in range(200)} == {10.0, 20.0, 30.0, 40.0}


def test_normal_duration():
    d = Duration.parse({"mean": 100, "std": 10})
    assert d.quantile(0.5) == pytest.approx(100.0)
    assert d.quantile(0.95) == pytest.approx(116.449, abs=1e-3)  # 100 + 10 * 1.6449
    assert d.quantile("max") == pytest.approx(137.190, abs=1e-3)  # 0.9999 quantile: z = 3.7190
    assert d.quantile(1.0) == d.quantile("max")
    assert d.mean() == 100.0
    # Truncated at a small positive floor: a very wide normal never gives <= 0.
    wide = Duration.parse({"mean": 10, "std": 100})
    assert wide.quantile(0.01) > 0
    assert Duration.parse({"mean": 50, "std": 0}).quantile("max") == 50.0


def test_lognormal_duration():
    d = Duration.parse({"p50": 100, "p95": 150, "max": 200})
    assert d.quantile(0.5) == 100.0
    assert d.quantile(0.95) == 150.0
    assert d.quantile("max") == d.quantile(1.0) == 200.0
    # q = 0.9: 100 * 1.5 ** (1.28155 / 1.64485) = 137.15
    assert d.quantile(0.9) == pytest.approx(137.15, abs=0.01)
    # q = 0.999 uncapped: 100 * 1.5 ** (3.0902 / 1.64485) = 214.2 > 200, so capped.
    assert d.quantile(0.999) == 200.0
    # Without max, "max" is the 0.9999 quantile: 100 * 1.5 ** (3.7190 / 1.64485) = 250.1
    open_ended = Duration.parse({"p50": 100, "p95": 150})
    assert open_ended.quantile("max") == pytest.approx(250.12, abs=0.01)
    # Mean of the capped law, against a large Monte Carlo average.
    rng = np.random.default_rng(7)
    draws = [d.sample(rng) for _ in range(100_000)]
    assert d.mean() == pytest.approx(np.mean(draws), rel=5e-3)


@pytest.mark.parametrize(
    "raw",
    [120, {"samples": [3, 5, 8]}, {"mean": 100, "std": 40}, {"p50": 100, "p95": 150, "max": 170}, {"p50": 10, "p95": 30}],
)
def test_samples_stay_in_bounds_and_round_trip(raw):
    d = Duration.parse(raw)
    rng = np.random.default_rng(3)
    draws = np.array([d.sample(rng) for _ in range(5000)])
    assert (draws > 0).all()
    assert (draws <= d.quantile("max")).all()
    assert Duration.parse(d.to_raw()) == d
    assert d.to_raw() == raw


@pytest.mark.parametrize("q", [0, -0.1, 1.5, "p95", "", None, True, float("nan")])
def test_bad_quantile_raises(q):
    with pytest.raises(ValueError, match="quantile must be"):
        Duration.parse(100).quantile(q)


def test_parse_quantile_accepts_cli_text():
    assert parse_quantile("0.95") == 0.95
    assert parse_quantile("MAX") == "max"


@pytest.mark.parametrize(
    "raw",
    [0, -5, float("nan"), True, "fast", {"samples": []}, {"samples": [1, 0]}, {"mean": 0, "std": 1},
     {"mean": 10, "std": -1}, {"mean": 10}, {"p50": 0, "p95": 1}, {"p50": 2, "p95": 1},
     {"p50": 1, "p95": 2, "max": 1.5}, {"p95": 2}, {"samples": [1], "mean": 1, "std": 1}, {"speed": 3}, {}],
)
def test_bad_durations_raise(raw):
    with pytest.raises(ValueError):
        Duration.parse(raw)


# --- scaling rule ----------------------------------------------------------------------------


def _job(**changes) -> dict:
    job = {
        "name": "A",
        "params_b": 7,
        "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": 120, "host_mem_gb": 275.7},
        "train": {"gpus": 8, "gpu_type": "H800", "duration_s": 100, "host_mem_gb": 240},
    }
    job.update(changes)
    return job


def test_gpu_count_and_type_scaling():
    job = JobSpec.model_validate(_job())
    assert job.rollout.kind == "rollout" and job.train.kind == "train"
    assert job.rollout.duration_at(0.95) == 120.0
    assert job.rollout.duration_at(0.95, 16) == 60.0  # twice the GPUs, half the time
    assert job.rollout.duration_at(0.95, 4) == 240.0
    # Rollout is bandwidth bound: H20 -> H800 is 4.0 / 3.35 TB/s.
    assert job.rollout.duration_at(0.95, 8, "H800") == pytest.approx(120 * 4.0 / 3.35)
    # Train is compute bound: H800 -> A100 is 989.5 / 312 TFLOPS.
    assert job.train.duration_at("max", 8, "A100") == pytest.approx(100 * 989.5 / 312)
    # Both at once: 100 * (8 / 16) * 989.5 / 312.
    assert job.train.duration_at(0.5, 16, "A100") == pytest.approx(50 * 989.5 / 312)
    with pytest.raises(ValueError, match="unknown GPU type"):
        job.train.duration_at(0.5, 8, "TPU")


def test_scaling_table():
    table = {"gpus": [8, 16, 32], "duration_s": [120, 64, 36]}
    rollout = {"gpus": 8, "gpu_type": "H20", "duration_s": 120, "scaling": table}
    job = JobSpec.model_validate(_job(rollout=rollout))
    r = job.rollout
    assert r.duration_at(0.5, 8) == 120.0
    assert r.duration_at(0.5, 16) == 64.0  # exact at table points
    assert r.duration_at(0.5, 32) == 36.0
    # 24 GPUs: 1/24 lies 1/3 of the way from 1/32 to 1/16, so 36 + (64 - 36) / 3 = 45.333.
    assert r.duration_at(0.5, 24) == pytest.approx(36 + 28 / 3)
    # Outside the table: 1/g from the nearest point. 64 GPUs: 36 * 32 / 64; 4 GPUs: 120 * 8 / 4.
    assert r.duration_at(0.5, 64) == pytest.approx(18.0)
    assert r.duration_at(0.5, 4) == pytest.approx(240.0)
    # The reference point need not be the table's first entry: ref 16 GPUs at 60 s -> 8 GPUs is
    # 60 * T(8) / T(16) = 60 * 120 / 64 = 112.5.
    rollout16 = {"gpus": 16, "gpu_type": "H20", "duration_s": 60, "scaling": table}
    assert JobSpec.model_validate(_job(rollout=rollout16)).rollout.duration_at(0.5, 8) == pytest.approx(112.5)


def test_scaling_validation():
    with pytest.raises(ValidationError):
        Scaling(gpus=[8, 8], duration_s=[1, 2])
    with pytest.raises(ValidationError):
        Scaling(gpus=[8], duration_s=[1, 2])
    with pytest.raises(ValidationError):
        Scaling(gpus=[8], duration_s=[0])
    assert Scaling(gpus=[8], duration_s=[80]).time_at(16) == 40.0


def test_job_defaults_and_helpers():
    job = JobSpec.model_validate(_job())
    assert job.bytes_per_param == 2 and job.slo == 2.0 and job.max_staleness == 0
    assert job.iterations is None and job.arrival_s == 0
    assert job.weight_bytes == 7 * 1e9 * 2
    assert job.rollout.gpu_options == (8,) and job.rollout.gpu_types == ("H20",)
    assert job.phase("train") is job.train
    with pytest.raises(ValueError):
        job.phase("sync")


# --- jobs YAML -------------------------------------------------------------------------------

GOOD_YAML = """\
jobs:
  - name: A
    params_b: 7
    slo: 1.5
    rollout: {gpus: 8, gpu_type: H20, duration_s: 120, host_mem_gb: 275.7}
    train: {gpus: 8, gpu_type: H800, duration_s: 100, host_mem_gb: 240}
  - name: B
    params_b: 14
    rollout: {gpus: 8, gpu_type: H20, duration_s: 200}
    train: {gpus: 8, gpu_type: H800, duration_s: 150}
  - name: C
    params_b: 32
    rollout: {gpus: 16, gpu_type: H20, duration_s: 300}
    train: {gpus: 16, gpu_type: H800, duration_s: 250}
"""


def test_load_good_file(tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text(GOOD_YAML)
    jobs = load_jobs(path)
    assert jobs.names == ["A", "B", "C"]
    assert jobs["B"].slo == 2.0
    assert jobs.jobs[2].train.gpus == 16


@pytest.mark.parametrize(
    "old,new,key",
    [
        ("slo: 1.5", "slo: 1.5\n    colour: red", "jobs[0].colour"),  # unknown key
        ("{gpus: 8, gpu_type: H20, duration_s: 200}", "{gpus: 8, gpu_type: H20, duration_s: 200, warm: yes}",
         "jobs[1].rollout.warm"),
        ("{gpus: 16, gpu_type: H20, duration_s: 300}", "{gpus: sixteen, gpu_type: H20, duration_s: 300}",
         "jobs[2].rollout.gpus"),  # wrong type
        ("{gpus: 16, gpu_type: H20, duration_s: 300}", "{gpus: 0, gpu_type: H20, duration_s: 300}",
         "jobs[2].rollout.gpus"),
        ("duration_s: 120", "duration_s: 0", "jobs[0].rollout.duration_s"),  # zero duration
        ("duration_s: 100", "duration_s: -4", "jobs[0].train.duration_s"),  # negative duration
        ("duration_s: 150", "duration_s: {samples: [1, 0]}", "jobs[1].train.duration_s.samples[1]"),
        ("duration_s: 150", "duration_s: {p50: 5, p95: 4}", "jobs[1].train.duration_s"),
        ("duration_s: 150", "duration_s: {mean: 5, sd: 1}", "jobs[1].train.duration_s.sd"),
        ("duration_s: 150", "duration_s: fast", "jobs[1].train.duration_s"),
        ("gpu_type: H800, duration_s: 150", "gpu_type: X900, duration_s: 150", "jobs[1].train.gpu_type"),
        ("gpu_type: H20, duration_s: 300", "gpu_type: H20, gpu_types: [H20, Z1], duration_s: 300",
         "jobs[2].rollout.gpu_types[1]"),
        ("name: C", "name: A", "jobs[2].name"),  # duplicate
        ("params_b: 14", "params_b: -14", "jobs[1].params_b"),
        ("slo: 1.5", "slo: 0", "jobs[0].slo"),
        ("slo: 1.5", "slo: 1.5\n    max_staleness: 2", "jobs[0].max_staleness"),
        ("params_b: 14", "params_b: 14\n    iterations: 0", "jobs[1].iterations"),
        ("params_b: 14", "params_b: 14\n    arrival_s: -1", "jobs[1].arrival_s"),
        ("host_mem_gb: 240", "host_mem_gb: -1", "jobs[0].train.host_mem_gb"),
        ("duration_s: 300}", "duration_s: 300, scaling: {gpus: [16, 8], duration_s: [1, 2]}}",
         "jobs[2].rollout.scaling"),
        ("duration_s: 300}", "duration_s: 300, gpu_options: [16, 0]}", "jobs[2].rollout.gpu_options[1]"),
        ("    train: {gpus: 16, gpu_type: H800, duration_s: 250}\n", "", "jobs[2].train"),  # missing
    ],
)
def test_bad_jobs_file_names_file_and_key(tmp_path, old, new, key):
    assert old in GOOD_YAML
    path = tmp_path / "bad_jobs.yaml"
    path.write_text(GOOD_YAML.replace(old, new, 1))
    with pytest.raises(InputError) as info:
        load_jobs(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}: "), message
    assert info.value.key == key


def test_unknown_gpu_type_message(tmp_path):
    path = tmp_path / "jobs.yaml"
    path.write_text(GOOD_YAML.replace("gpu_type: H800, duration_s: 150", "gpu_type: X900, duration_s: 150"))
    with pytest.raises(InputError, match=r"unknown GPU type 'X900' \(known: A100, "):
        load_jobs(path)


def test_custom_gpu_catalog(tmp_path):
    from weave_rl.topology.catalog import GpuType

    path = tmp_path / "jobs.yaml"
    path.write_text(GOOD_YAML.replace("gpu_type: H800, duration_s: 150", "gpu_type: X900, duration_s: 150"))
    catalog = {"H20": GpuType(tflops_bf16=148, hbm_gb=96, hbm_tbps=4, usd_per_hour=1.85),
               "H800": GpuType(tflops_bf16=989.5, hbm_gb=80, hbm_tbps=3.35, usd_per_hour=5.28),
               "X900": GpuType(tflops_bf16=1979, hbm_gb=80, hbm_tbps=3.35, usd_per_hour=9)}
    jobs = load_jobs(path, catalog)
    assert jobs["B"].train.duration_at(0.5, 8, "H800", catalog) == pytest.approx(150 * 1979 / 989.5)


@pytest.mark.parametrize(
    "text,key,reason",
    [
        ("jobs: [\n  {name: A\n", None, "malformed YAML"),
        ("- name: A\n", None, "mapping"),
        ("name: A\n", "name", "unknown key"),
        ("{}\n", "jobs", "missing"),
        ("jobs: {name: A}\n", "jobs", "list"),
        ("jobs: [A]\n", "jobs[0]", "mapping"),
    ],
)
def test_malformed_jobs_files(tmp_path, text, key, reason):
    path = tmp_path / "weird.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_jobs(path)
    assert str(path) in str(info.value)
    assert reason in info.value.reason
    if key:
        assert info.value.key == key


def test_missing_jobs_file(tmp_path):
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(InputError, match="file not found") as info:
        load_jobs(path)
    assert str(path) in str(info.value)


def test_phase_kind_is_not_a_yaml_key():
    with pytest.raises(InputError) as info:
        jobs_from_data({"jobs": [_job(train={"kind": "train", "gpus": 8, "gpu_type": "H800", "duration_s": 1})]}, "j.yaml")
    assert info.value.key == "jobs[0].train"


def test_jobs_yaml_round_trip(tmp_path):
    rich = _job(
        name="rich",
        bytes_per_param=1,
        slo=0.8,  # legal in the file; the planner rejects SLO < 1
        max_staleness=1,
        iterations=300,
        arrival_s=12.5,
        rollout={
            "gpus": 8,
            "gpu_type": "H20",
            "duration_s": {"p50": 100, "p95": 130, "max": 160},
            "host_mem_gb": 275.7,
            "scaling": {"gpus": [8, 16, 32], "duration_s": [120, 64, 36]},
            "gpu_options": [8, 16],
            "gpu_types": ["H20", "H800"],
        },
        train={"gpus": 8, "gpu_type": "H800", "duration_s": {"mean": 90, "std": 5.5}},
    )
    plain = _job(name="plain", rollout={"gpus": 8, "gpu_type": "H20", "duration_s": {"samples": [1.5, 2, 3]}})
    jobs = jobs_from_data({"jobs": [rich, plain]}, "in.yaml")
    path = tmp_path / "out" / "jobs.yaml"
    save_jobs(jobs, path)
    assert load_jobs(path) == jobs
    data = jobs_to_data(jobs)
    assert jobs_from_data(data, "again.yaml") == jobs
    # Defaults are left out of the written form.
    assert "bytes_per_param" not in data["jobs"][1] and "gpu_options" not in data["jobs"][1]["rollout"]
    assert data["jobs"][0]["rollout"]["gpu_types"] == ["H20", "H800"]


def test_jobset_rejects_duplicates_directly():
    job = JobSpec.model_validate(_job())
    with pytest.raises(ValidationError, match=r"jobs\[1\].name"):
        JobSet(jobs=[job, job])


# --- records ---------------------------------------------------------------------------------


def _rows(job="A", phase="rollout", gpus=8, gpu_type="H20", durations=(10.0, 12.0)):
    return [
        {"job": job, "iteration": i, "phase": phase, "gpus": gpus, "gpu_type": gpu_type,
         "start_s": 100.0 * i, "duration_s": d, "switch_s": 0.9,
         "tokens": 1000.0 * (i + 1) if phase == "rollout" else float("nan")}
        for i, d in enumerate(durations)
    ]


def test_records_frame_dtypes():
    frame = records_frame(_rows() + _rows(phase="train", gpu_type="H800"))
    assert list(frame.columns) == RECORD_COLUMNS
    assert frame["iteration"].dtype == np.int64 and frame["gpus"].dtype == np.int64
    assert frame["duration_s"].dtype == np.float64 and frame["tokens"].dtype == np.float64
    assert frame["tokens"].isna().sum() == 2


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_records_round_trip(tmp_path, suffix):
    rows = _rows() + _rows(job="NA", phase="train", gpu_type="H800")  # a job may be named "NA"
    for row in rows:
        row["note"] = "warm"  # extra columns are kept
    frame = records_frame(rows)
    path = tmp_path / f"records.{suffix}"
    write_records(frame, path)
    back = read_records(path)
    pd.testing.assert_frame_equal(back, frame)
    assert back["job"].tolist() == ["A", "A", "NA", "NA"]


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
@pytest.mark.parametrize(
    "column,values,key",
    [
        ("duration_s", [10.0, 0.0], "row 1.duration_s"),
        ("duration_s", [-1.0, 3.0], "row 0.duration_s"),
        ("duration_s", [10.0, None], "row 1.duration_s"),
        ("start_s", ["0", "soon"], "row 1.start_s"),
        ("gpus", [8, 2.5], "row 1.gpus"),
        ("gpus", [0, 8], "row 0.gpus"),
        ("switch_s", [0.1, -0.1], "row 1.switch_s"),
    ],
)
def test_bad_records_name_row_and_column(tmp_path, suffix, column, values, key):
    frame = pd.DataFrame(_rows())
    frame[column] = values
    path = tmp_path / f"bad.{suffix}"
    write_records(frame, path)
    with pytest.raises(InputError) as info:
        read_records(path)
    assert info.value.key == key
    assert str(path) in str(info.value)


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_records_missing_column(tmp_path, suffix):
    path = tmp_path / f"short.{suffix}"
    write_records(pd.DataFrame(_rows()).drop(columns=["switch_s"]), path)
    with pytest.raises(InputError) as info:
        read_records(path)
    assert info.value.key == "switch_s" and "missing" in info.value.reason


def test_records_tokens_column_optional(tmp_path):
    path = tmp_path / "no_tokens.csv"
    pd.DataFrame(_rows()).drop(columns=["tokens"]).to_csv(path, index=False)
    assert read_records(path)["tokens"].isna().all()


def test_records_bad_suffix_and_missing_file(tmp_path):
    with pytest.raises(InputError, match="use .csv or .parquet"):
        read_records(tmp_path / "records.json")
    with pytest.raises(InputError, match="use .csv or .parquet"):
        write_records(records_frame(_rows()), tmp_path / "records.txt")
    with pytest.raises(InputError, match="file not found"):
        read_records(tmp_path / "absent.csv")


# --- fit -------------------------------------------------------------------------------------


def _two_jobs() -> JobSet:
    return jobs_from_data({"jobs": [_job(), _job(name="B")]}, "jobs.yaml")


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_fit_round_trip_matches_numpy(tmp_path, suffix):
    rng = np.random.default_rng(11)
    at8 = rng.lognormal(math.log(100), 0.2, size=40)
    at16 = rng.lognormal(math.log(55), 0.2, size=9)
    rows = _rows(durations=at8) + _rows(gpus=16, durations=at16)
    rows += _rows(phase="reward", durations=[5.0]) + _rows(phase="sync", durations=[0.9])  # ignored
    path = tmp_path / f"records.{suffix}"
    write_records(records_frame(rows), path)
    jobs = _two_jobs()
    fitted = fit_jobs(read_records(path), jobs, records_file=str(path))

    d = fitted["A"].rollout.duration_s
    assert d.quantile(0.5) == np.quantile(at8, 0.5)
    assert d.quantile(0.95) == np.quantile(at8, 0.95)
    assert d.quantile("max") == at8.max()
    scaling = fitted["A"].rollout.scaling
    assert scaling.gpus == (8, 16)
    assert scaling.duration_s == (np.median(at8), np.median(at16))
    # Untouched: A's train phase (no records) and job B.
    assert fitted["A"].train == jobs["A"].train
    assert fitted["B"] == jobs["B"]
    # The result is a valid jobs file.
    assert jobs_from_data(jobs_to_data(fitted), "fitted.yaml") == fitted


def test_fit_moves_reference_point_when_not_measured():
    # Train measured only on 16 A100 (twice) and 8 A100 (once): the most-measured point wins.
    rows = _rows(phase="train", gpus=16, gpu_type="A100", durations=[40.0, 44.0])
    rows += _rows(phase="train", gpus=8, gpu_type="A100", durations=[80.0])
    fitted = fit_jobs(records_frame(rows), _two_jobs())
    train = fitted["A"].train
    assert (train.gpus, train.gpu_type) == (16, "A100")
    assert train.gpu_options == (16,) and train.gpu_types == ("A100",)
    assert train.duration_s.to_raw() == {"p50": 42.0, "p95": pytest.approx(43.8), "max": 44.0}
    assert train.scaling.gpus == (8, 16) and train.scaling.duration_s == (80.0, 42.0)


def test_fit_single_sample_is_a_number():
    fitted = fit_jobs(records_frame(_rows(durations=[97.5])), _two_jobs())
    assert fitted["A"].rollout.duration_s.to_raw() == 97.5
    assert fitted["A"].rollout.scaling is None


def test_fit_counts_the_time_a_phase_kept_its_devices_after_its_work():
    # The real backends' after_s (samples written, weights copied, checkpoint): part of the phase's time.
    frame = records_frame(_rows(phase="train", durations=[40.0, 44.0]))
    frame["after_s"] = [2.0, 4.0]
    assert fit_jobs(frame, _two_jobs())["A"].train.duration_s.to_raw() == {"p50": 45.0, "p95": pytest.approx(47.7),
                                                                          "max": 48.0}
    frame["after_s"] = [float("nan"), 4.0]  # a row without it (another backend's) counts as 0
    assert fit_jobs(frame, _two_jobs())["A"].train.duration_s.to_raw()["max"] == 48.0


def test_fit_measures_the_sync_beyond_the_network_model_and_the_planner_adds_it():
    from weave_rl.planner.api import make_plan
    from weave_rl.planner.check import check_plan
    from weave_rl.topology.topology import load_topology

    frame = records_frame(_rows(phase="sync", durations=[5.5, 6.5, 6.0]))
    frame["planned_s"] = [0.5, 0.5, 0.5]  # what the plan gave each sync
    once = fit_jobs(frame, _two_jobs())
    assert once["A"].sync_overhead_s == 5.5 and once["B"].sync_overhead_s == 0.0
    assert jobs_from_data(jobs_to_data(once), "fitted.yaml") == once  # written and read back
    frame["planned_s"] = [6.0, 6.0, 6.0]  # a plan that already counted 5.5 s of it: 0.5 s less than measured
    assert fit_jobs(frame, once)["A"].sync_overhead_s == 5.5
    assert fit_jobs(frame.drop(columns="planned_s"), _two_jobs())["A"].sync_overhead_s == 0.0  # nothing to compare

    topo = load_topology("weave-testbed")
    base = jobs_from_data({"jobs": [_job()]}, "jobs.yaml")
    slow = jobs_from_data({"jobs": [_job(sync_overhead_s=5.5)]}, "jobs.yaml")
    syncs = []
    for jobs in (base, slow):
        plan = make_plan(topo, jobs, policy="solo", time_limit_s=5)
        assert check_plan(plan, topo, jobs) == []
        syncs.append(plan.groups[0].jobs[0].phase("sync").duration_s)
    assert syncs[1] == pytest.approx(syncs[0] + 5.5)


def test_fit_unknown_job_or_phase():
    with pytest.raises(InputError) as info:
        fit_jobs(records_frame(_rows(job="Z")), _two_jobs(), records_file="runs.csv")
    assert "runs.csv" in str(info.value) and "'Z'" in str(info.value)
    with pytest.raises(InputError) as info:
        fit_jobs(records_frame(_rows(phase="warmup")), _two_jobs(), records_file="runs.csv")
    assert info.value.key == "row 0.phase" and "runs.csv" in str(info.value)


# --- generators ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_generators_deterministic_and_counted(family):
    a = generate(family, 12, seed=5)
    assert a == generate(family, 12, seed=5)
    assert len(a) == 12 and len(set(a.names)) == 12
    assert len(generate(family, 0, seed=5)) == 0
    assert jobs_from_data(jobs_to_data(a), "gen.yaml") == a  # valid jobs files


def test_generators_differ_by_seed():
    assert generate("Mixed", 10, seed=1) != generate("Mixed", 10, seed=2)


def test_unknown_family():
    with pytest.raises(ValueError, match="micro, BL, RH, TH, Mixed, seed"):
        generate("huge", 3, 0)


def _classes(job) -> list[tuple[str, str]]:
    r, t = job.rollout.duration_s.quantile(0.5), job.train.duration_s.quantile(0.5)
    return [
        (fam, size)
        for fam, sizes in SYNTHETIC.items()
        for size, ((rlo, rhi), (tlo, thi)) in sizes.items()
        if rlo <= r <= rhi and tlo <= t <= thi
    ]


@pytest.mark.parametrize("family", ["BL", "RH", "TH", "Mixed"])
def test_synthetic_ranges(family):
    jobs = generate(family, 200, seed=3)
    seen = set()
    for i, job in enumerate(jobs):
        assert job.name == f"{family.lower()}-{i:03d}"
        classes = _classes(job)
        assert classes, job
        if family != "Mixed":
            assert all(fam == family for fam, _ in classes)
        seen.update(classes)
        assert job.params_b in (3, 7, 14, 32)
        assert (job.rollout.host_mem_gb, job.train.host_mem_gb) == HOST_MEM_GB[int(job.params_b)]
        assert (job.rollout.gpus, job.rollout.gpu_type, job.train.gpus, job.train.gpu_type) == (8, "H20", 8, "H800")
        assert 1.0 <= job.slo <= 2.0 and round(job.slo, 2) == job.slo
        assert 50 <= job.iterations <= 300
        assert round(job.rollout.duration_s.quantile(1.0), 1) == job.rollout.duration_s.quantile(1.0)
    arrivals = [job.arrival_s for job in jobs]
    assert arrivals[0] == 0 and arrivals == sorted(arrivals)
    gaps = np.diff(arrivals)
    assert 1400 < gaps.mean() < 2200  # mean 1800 s over 199 gaps
    if family == "Mixed":
        assert {fam for fam, _ in seen} == {"BL", "RH", "TH"}


def test_micro_jobs():
    expected = {"A": (140.0, 116.8), "B": (230.0, 220.0), "C": (290.0, 272.3), "D": (300.0, 120.0), "E": (448.9, 74.8)}
    for letter, (roll, train) in expected.items():
        job = micro_job(letter)
        assert job.name == letter and job.slo == 1.5
        assert (job.rollout.duration_s.quantile(0.5), job.train.duration_s.quantile(0.5)) == (roll, train)
        assert (job.rollout.gpu_type, job.train.gpu_type) == ("H20", "H800")
    assert micro_job("A").rollout.duration_s.quantile(0.5) + micro_job("A").train.duration_s.quantile(0.5) + 0.9 == pytest.approx(257.7)
    assert micro_job("C").rollout.gpus == micro_job("C").train.gpus == 16
    assert [j.params_b for j in map(micro_job, "ABCDE")] == [7, 14, 32, 8, 14]
    assert micro_job("D").rollout.host_mem_gb == 275.7 and micro_job("E").train.host_mem_gb == 456.1
    jobs = generate("micro", 7, seed=0)
    assert [j.rollout.duration_s.quantile(0.5) for j in jobs] == [140.0, 230.0, 290.0, 300.0, 448.9, 140.0, 230.0]
    with pytest.raises(ValueError):
        micro_job("F")


def test_seed_job():
    job = seed_job()
    assert job.params_b == 7 and job.slo == 2.0
    assert (job.rollout.gpus, job.rollout.duration_s.quantile(0.5)) == (20, 60.0)
    assert (job.train.gpus, job.train.duration_s.quantile(0.5)) == (12, 30.0)
    for phase in (job.rollout, job.train):
        assert phase.gpu_type == "A100" and phase.gpu_types == ("A100",)
        assert phase.gpu_options == (4, 8, 12, 16, 20, 24, 28, 32)
    assert job.rollout.duration_at(0.95, 32) == pytest.approx(37.5)  # 60 * 20 / 32
    assert generate("seed", 2, seed=0).names == ["seed-0", "seed-1"]
