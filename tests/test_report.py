"""``weave report``: the HTML page of a run folder, its tables, its errors, and how it renders in a
real headless browser (Debian's chromium; installed with apt-get when missing and we are root)."""

import json
import os
import re
import shutil
import subprocess

import pandas as pd
import pytest

from weave_rl.executor.report import build_report
from weave_rl.executor.report.figures import iteration_times
from weave_rl.executor.report.load import load_run
from weave_rl.executor.report.tables import node_bubbles, profile_fits
from weave_rl.profiles.records import RECORD_COLUMNS
from weave_rl.cli.app import main

PLAN = "plans/micro-a.yaml"
ARGS = ["--jobs", "plans/inputs/micro-a.jobs.yaml", "--topology", "plans/inputs/micro-a.topology.yaml"]
SECTIONS = ["run", "gantt", "utilization", "iterations", "replans", "profiles"]
FIGURES = ["gantt-g0", "pools", "busy", "iterations"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """micro-a, 12 iterations: A1's rollout 1.6x slower from 600 s (one drift replan), train-000 down at 150 s."""
    out = tmp_path_factory.mktemp("run") / "micro-a"
    code = main(["simulate", PLAN, *ARGS, "--iterations", "12", "--drift", "A1:rollout:1.6@600",
                 "--fail", "train-000@150+60", "--out", str(out)])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def page(run_dir):
    report = build_report(run_dir, run_dir / "report.html")
    return report, report.path.read_text()


def test_page_has_every_section_and_chart(page):
    report, text = page
    assert report.sections == SECTIONS
    assert report.figures == FIGURES
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in text
    for name in FIGURES:
        assert f'data-figure="{name}"' in text
    assert "<h2>Planned vs measured timetable</h2>" in text
    assert "planned: group g0, cycle 282.2 s, 3 cycles" in text  # micro-a's cycle
    assert report.notes == []


def test_page_is_self_contained(page):
    _, text = page
    assert "<script src" not in text and "<link" not in text
    # Outside the inlined plotly.js bundle, no URL at all; the run's PNG is a data URI.
    outside = re.sub(r"<script\b[^>]*>.*?</script>", "", text, flags=re.S)
    assert "http://" not in outside and "https://" not in outside
    assert outside.count('src="data:image/png;base64,') == 1  # utilization.png
    assert text.count("<script") >= len(FIGURES)


def test_page_reports_the_runs_facts(run_dir, page):
    _, text = page
    metrics = json.loads((run_dir / "metrics.json").read_text())
    replan = metrics["replans"][0]
    assert replan["job"] == "A1" and replan["reason"] in text  # e.g. "A1 rollout at 1.50x of its profile ..."
    assert "node train-000 down; from iteration 0, 1 rollouts redone" in text
    assert "<td>57.0</td>" in text  # $/h before and after: one H20 node + one H800 node = 8 x 1.85 + 8 x 5.28
    assert "jobs file: plans/inputs/micro-a.jobs.yaml" in text


def test_profile_fits_see_the_drift(run_dir):
    (cols, rows), note = profile_fits(load_run(run_dir))
    fits = {(r[0], r[1]): dict(zip(cols, r)) for r in rows}
    # micro-a's durations are fixed numbers: A2 (no drift) measures exactly its profile, 140 s on 8 H20.
    a2 = fits[("A2", "rollout")]
    assert a2["at"] == "8 x H20" and a2["profile p50 s"] == pytest.approx(140.0)
    assert a2["measured p50 s"] == pytest.approx(140.0) and a2["samples"] == 12
    # A1's rollouts that start after 600 s take 1.6 x 140 = 224 s: most of its 13 (one redone after the fault).
    a1 = fits[("A1", "rollout")]
    assert a1["samples"] == 13 and a1["measured p50 s"] == pytest.approx(224.0)
    assert a1["ratio p50"] == pytest.approx(1.6)


def test_iteration_times_and_node_bubbles_by_hand():
    frame = pd.DataFrame([
        # job X: rollout 10..40 (switch 5), train 40..60, sync 60..100; rollout 100..130, train 150..170, sync ..250
        dict(job="X", iteration=0, phase="rollout", start_s=10.0, end_s=40.0, switch_s=5.0, nodes="n1"),
        dict(job="X", iteration=0, phase="train", start_s=40.0, end_s=60.0, switch_s=0.0, nodes="n2"),
        dict(job="X", iteration=0, phase="sync", start_s=60.0, end_s=100.0, switch_s=0.0, nodes="n1"),
        dict(job="X", iteration=1, phase="rollout", start_s=100.0, end_s=130.0, switch_s=0.0, nodes="n1"),
        dict(job="X", iteration=1, phase="train", start_s=150.0, end_s=170.0, switch_s=0.0, nodes="n2"),
        dict(job="X", iteration=1, phase="sync", start_s=170.0, end_s=250.0, switch_s=0.0, nodes="n1"),
    ]).assign(cluster=lambda f: f["nodes"])
    assert iteration_times(frame) == {"X": [(0, 90.0), (1, 150.0)]}
    cols, rows = node_bubbles(frame, 250.0)
    by_node = {r[0]: dict(zip(cols, r)) for r in rows}
    # n1 computes 5..40 (switch included) and 100..130: 65 of 250 s; its longest bubble is 130..250.
    assert by_node["n1"]["busy %"] == pytest.approx(26.0)
    assert (by_node["n1"]["longest bubble s"], by_node["n1"]["at t s"]) == (pytest.approx(120.0), 130.0)
    assert by_node["n2"]["busy %"] == pytest.approx(16.0) and by_node["n2"]["phases"] == 2


def test_folder_of_another_backend_without_the_sims_extras(run_dir, tmp_path, capsys):
    """Only the DESIGN 3.4 columns, as CSV, and no plan to be found: a measured-only page."""
    other = tmp_path / "other"
    other.mkdir()
    pd.read_parquet(run_dir / "records.parquet")[RECORD_COLUMNS].to_csv(other / "records.csv", index=False)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["inputs"]["plan"] = "nowhere/plan.yaml"
    (other / "metrics.json").write_text(json.dumps(metrics))
    assert main(["report", str(other), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["figures"] == ["gantt-all", "pools", "busy", "iterations"]
    assert out["notes"] == [f"plan 'nowhere/plan.yaml' (from metrics.json) not found from here or from {other}"]
    assert (other / "report.html").exists()
    # With --plan the planned panel comes back, and the records are placed on the plan's nodes.
    assert main(["report", str(other), "--plan", PLAN, "-o", str(tmp_path / "r.html"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["figures"] == FIGURES


@pytest.mark.parametrize("make, needle", [
    (lambda d: None, "no such folder"),
    (lambda d: d.write_text("x"), "not a folder"),
    (lambda d: d.mkdir(), "not a run folder: no metrics.json"),
    (lambda d: (d.mkdir(), (d / "metrics.json").write_text("{}")),
     "not a run folder: no records.parquet or records.csv"),
    (lambda d: (d.mkdir(), (d / "metrics.json").write_text("{\"jobs\": 2,")), "metrics.json: not valid JSON (line 1"),
    (lambda d: (d.mkdir(), (d / "metrics.json").write_text("[1]")), "metrics.json: expected a JSON object"),
    (lambda d: (d.mkdir(), (d / "metrics.json").write_text("{}"),
                (d / "records.csv").write_text("job,iteration\nA,x\n")),
     "records.csv: 6 problems\n  phase: required column is missing (columns: job, iteration)\n  gpus: required column"),
])
def test_missing_or_garbled_folder_is_one_line_exit_2(tmp_path, capsys, make, needle):
    folder = tmp_path / "run"
    make(folder)
    code = main(["report", str(folder), "-o", str(tmp_path / "r.html")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    # One line, or one line per problem when the file has several (every missing column, here).
    assert needle in err and ("\n" not in err or " problems\n" in err) and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


# ----- a real browser -----------------------------------------------------------------------------
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> tuple[str | None, str]:
    """The browser's path, or None and why; installs Debian's chromium with apt-get when we are root."""
    for name in BROWSERS:
        if path := shutil.which(name):
            return path, ""
    if not shutil.which("apt-get") or os.geteuid() != 0:
        return None, "chromium not found, and apt-get is not available to root here to install it"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
            if done.returncode != 0:
                return None, f"chromium not found and `{' '.join(cmd)}` failed: {done.stderr.strip()[-300:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"chromium not found and could not be installed: {exc}"
    path = shutil.which("chromium")
    return path, "" if path else "apt-get installed chromium but it is not on PATH"


def headless(browser: str, profile, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--virtual-time-budget=10000"]
    return subprocess.run([browser, *flags, *args], capture_output=True, text=True, timeout=180)


def test_page_renders_in_headless_chromium(page, tmp_path):
    browser, why = find_chromium()
    if browser is None:
        pytest.skip(why)
    report, text = page
    assert 'class="main-svg"' not in text  # only plotly.js, once it runs, draws the charts' SVG
    done = headless(browser, tmp_path / "profile", "--dump-dom", report.path.as_uri())
    assert done.returncode == 0 and "</html>" in done.stdout, done.stderr[-2000:]
    dom = re.sub(r"<script\b[^>]*>.*?</script>", "", done.stdout, flags=re.S)  # the DOM, not the code
    for title in ("Run", "Planned vs measured timetable", "Utilization and bubbles per pool",
                  "Iteration times against the SLO", "Replans and events", "Profile fits"):
        assert f"<h2>{title}</h2>" in dom
    # plotly.js ran: every chart's div holds its drawn SVG (plotly adds class "main-svg" when it draws).
    chunks = dom.split('data-figure="')[1:]
    assert [c.split('"', 1)[0] for c in chunks] == FIGURES
    for chunk in chunks:
        assert 'class="main-svg"' in chunk
    # The planned and measured panels: one bar trace per (job, phase) in each, drawn as SVG paths.
    gantt = chunks[0]
    assert gantt.count('class="trace bars"') >= 2 * 4  # A1 and A2, rollout and train, twice; syncs and switches too
    shot = tmp_path / "page.png"
    done = headless(browser, tmp_path / "profile2", "--window-size=1400,3000", f"--screenshot={shot}",
                    report.path.as_uri())
    assert done.returncode == 0 and shot.stat().st_size > 50_000  # a drawn page, not a blank one
