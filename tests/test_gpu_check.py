"""bench/gpu_check.py on a CPU machine: the CUDA rows skip with a reason, --device cpu runs checks 2, 3, 5."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.py"
CHECKS = ["environment", "pinned", "comm", "vllm", "elastic"]


def load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(tmp_path, *extra, timeout=240):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    return proc, json.loads(out.read_text())


def rows_by_name(doc):
    rows = doc["rows"]
    assert [r["check"] for r in rows] == CHECKS  # one row per check, in order
    return {r["check"]: r for r in rows}


def test_bandwidth_arithmetic():
    g = load()
    assert g.gbps(2e9, 1.0) == pytest.approx(2.0)
    assert g.gbps(1 << 30, 0.5) == pytest.approx(2 * (1 << 30) / 1e9)
    assert g.gbps(1, 0.0) == float("inf")
    # all-reduce bus bandwidth: algbw x 2(n-1)/n (n=2: equal; n=8: 1.75x)
    assert g.bus_bandwidth(4e9, 2.0, 2) == pytest.approx(2.0)
    assert g.bus_bandwidth(4e9, 2.0, 8) == pytest.approx(2.0 * 14 / 8)
    assert g.bus_bandwidth(4e9, 2.0, 1) == 0.0


def test_helpers():
    g = load()
    assert g.one_line(ValueError("a\n  b")) == "ValueError: a b"
    assert g.one_line(g.RankFailed("KeyError: 'x'")) == "KeyError: 'x'"
    state = g.state_dict(64 << 20, pinned=False)
    assert len(state) > 20 and abs(g.nbytes_of(state) - (64 << 20)) < (8 << 20)
    text = g.table([{"check": "pinned", "status": "skipped: CUDA not available", "seconds": 0.0, "figures": {}},
                    {"check": "comm", "status": "ok", "seconds": 1.25, "figures": {"ar_busbw": 1.23456}}])
    assert "CUDA not available" in text and "ar_busbw=1.23" in text


def test_cpu_machine_skips_cuda_rows(tmp_path):
    proc, doc = run(tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = rows_by_name(doc)
    env = rows["environment"]
    assert env["status"] == "ok"
    for key in ("torch", "cuda_available", "gpus", "python"):
        assert key in env["figures"], key
    if env["figures"]["cuda_available"]:
        pytest.skip("this machine has CUDA")
    for name in CHECKS[1:]:
        assert rows[name]["status"].startswith("skipped: ") and "CUDA" in rows[name]["status"], rows[name]
    assert "total" in proc.stdout and "check" in proc.stdout  # the table and the total


def test_device_cpu_runs_pinned_comm_elastic(tmp_path):
    proc, doc = run(tmp_path, "--device", "cpu", "--workload", "bandit")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = rows_by_name(doc)
    for name in ("environment", "pinned", "comm", "elastic"):
        assert rows[name]["status"] == "ok", rows[name]
    assert rows["vllm"]["status"].startswith("skipped: ") and "CUDA" in rows["vllm"]["status"]
    pinned = rows["pinned"]["figures"]
    assert pinned["params"] > 20 and all(pinned[k] > 0 for k in ("h2d_toy", "d2h_toy", "h2d_peak", "d2h_peak"))
    comm = rows["comm"]["figures"]
    assert comm["backend"] == "gloo" and comm["ar_busbw"] > 0 and comm["bc_params"] > 20
    el = rows["elastic"]["figures"]
    assert el["shares_p0"] + el["shares_p1"] == 8 and el["shares_p0"] >= 1
    assert el["ids_equal"] and el["tokens_equal"] and el["max_float_diff"] == 0.0


def test_only_and_deadline(tmp_path):
    proc, doc = run(tmp_path, "--device", "cpu", "--only", "pinned", "--deadline", "1", timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = rows_by_name(doc)
    assert rows["environment"]["status"] == "ok"  # always: it decides what the others can do
    assert "deadline" in rows["pinned"]["status"]
    assert rows["comm"]["status"] == "skipped: not in --only"
