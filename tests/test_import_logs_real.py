"""Framework logs in the shapes real runs write them (issue 24): veRL's two key generations, Ray
prefixes with ANSI colour, tqdm ``\\r`` redraws on the metrics line, ``np.float64(...)`` values,
one-key-per-line dumps, GPU counts from the config or command line the log prints; OpenRLHF's
``Global step`` lines (sync and async trainers); ROLL's current pipeline keys. Every number below is
checkable by hand from the log text in the test or in ``examples/logs``."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from weave_rl.profiles.importers import ImportOptions, import_framework_log
from weave_rl.core.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "examples" / "logs"
H800 = ImportOptions(gpu_type="H800")
RAY = "\x1b[36m(TaskRunner pid=7)\x1b[0m "


def rows(result, phase):
    frame = result.records
    return frame[frame["phase"] == phase].reset_index(drop=True)


def grep_n(path: Path, needle: str) -> list[int]:
    """What ``grep -n`` prints: only "\\n" ends a line."""
    return [i for i, line in enumerate(path.read_bytes().split(b"\n"), start=1) if needle.encode() in line]


# ----- veRL --------------------------------------------------------------------------------------

def test_verl_ray_console_with_ansi_tqdm_numpy_and_its_printed_config():
    log = LOGS / "verl_ray_tqdm.log"
    r = import_framework_log("verl", log, H800)
    # no --config and no file beside the log: main_ppo's pprint of the resolved config (line 2) says
    # trainer.nnodes 2 x n_gpus_per_node 8 with the hybrid engine: 16 shared GPUs
    assert r.config_file == "the config printed at line 2"
    assert r.job == "qwen2_7b_grpo"
    assert (r.placement.rollout_gpus, r.placement.train_gpus) == (16, 16)
    rollout, train = rows(r, "rollout"), rows(r, "train")
    assert list(rollout["duration_s"]) == [61.2, 63.8, 60.0]  # timing_s/gen, np.float64(...) unwrapped
    # reward + old_log_prob + ref + adv + update_actor: 3.1+9.4+8.7+0.21+44.6, 3+9.5+8.6+0.2+45.1, 3.2+9.3+8.8+0.2+44.9
    assert list(train["duration_s"]) == [66.01, 66.4, 66.4]
    assert rows(r, "sync").empty  # hybrid engine: no update_weights timer
    assert list(rollout["start_s"]) == [0.0, 127.4, 288.1]  # timing_s/step 127.4, then 160.7 (testing inside)
    assert list(rollout["tokens"]) == [12_000_000, 11_000_000, 12_000_000]  # 61.2 s / 0.0051 ms, ...
    # each step sits on the line after a tqdm redraw; its source_line is the line grep -n shows
    assert grep_n(log, "step:") == [26, 27, 29]
    assert list(rollout["source_line"]) == [26, 27, 29]
    # the 21 lines of the printed config count once, at its first line
    assert r.warnings == ["6 lines skipped: 1, 23, 24, 25, 28, 30 (not a veRL metrics line)",
                          "1 line skipped: 2 (the run's printed config, not a step)"]


def test_tqdm_carriage_returns_do_not_shift_line_numbers(tmp_path):
    bars = "".join(f"\rTraining Progress:  {k}%|          | {k}/100 [00:0{k}<?, ?it/s]" for k in range(9))
    log = tmp_path / "run.log"
    log.write_bytes((f"starting\n{bars}step:1 - timing_s/gen:10 - timing_s/update_actor:5\n"
                     f"{bars}\n{bars}step:2 - timing_s/gen:oops - timing_s/update_actor:5\n"
                     "step:3 - timing_s/gen:12 - timing_s/update_actor:6\r\n").encode())
    r = import_framework_log("verl", log, ImportOptions(gpu_type="H800", train_gpus=8))
    assert list(rows(r, "rollout")["source_line"]) == [2, 5]  # 9 redraws per line, still one line each
    assert list(rows(r, "rollout")["duration_s"]) == [10.0, 12.0]  # a CRLF ending is fine too
    # the bare bar line is skipped once (not 9 times); the bad value is reported at its own line 4
    assert r.warnings == ["2 lines skipped: 1, 3 (not a veRL metrics line)",
                          "1 line skipped: 4 (unreadable value 'oops' for timing_s/gen)"]


def test_ansi_colour_codes_anywhere_in_the_line(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(f"{RAY}\x1b[32mstep:4\x1b[0m - \x1b[1mtiming_s/gen\x1b[0m:20.5 - timing_s/update_actor:\x1b[33m7.5\x1b[0m"
                   " - timing_s/update_weights:1.25\n")
    r = import_framework_log("verl", log, ImportOptions(gpu_type="H800", train_gpus=8, rollout_gpus=4))
    assert list(r.records["phase"]) == ["rollout", "train", "sync"]
    assert list(r.records["duration_s"]) == [20.5, 7.5, 1.25]
    assert list(r.records["gpus"]) == [4, 8, 4]
    assert r.warnings == []


def test_numpy_scalars_of_every_width(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("step:1 - timing_s/gen:np.float32(8.5) - timing_s/update_actor:numpy.float64(2.5)"
                   " - timing_s/adv:np.int64(1) - timing_s/step:np.float64(13.0)\n"
                   "step:2 - timing_s/gen:np.float64(9.0) - timing_s/update_actor:np.float64(3.0)\n")
    r = import_framework_log("verl", log, ImportOptions(gpu_type="H800", train_gpus=8))
    assert list(rows(r, "train")["duration_s"]) == [3.5, 3.0]  # update_actor 2.5 + adv 1
    assert list(rows(r, "rollout")["start_s"]) == [0.0, 13.0]  # timing_s/step of step 1


def test_one_key_per_line_dump(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("".join(f"{RAY}{line}\n" for line in [
        "step:1", "timing_s/gen:30.0", "timing_s/old_log_prob:4.0", "timing_s/update_actor:16.0",
        "timing_s/step:51.0", "Training Progress: 1/2",
        "step:2", " - timing_s/gen: 32.0", " - timing_s/update_actor: 17.0",
    ]))
    r = import_framework_log("verl", log, ImportOptions(gpu_type="H800", train_gpus=8))
    assert list(rows(r, "rollout")["duration_s"]) == [30.0, 32.0]
    assert list(rows(r, "train")["duration_s"]) == [20.0, 17.0]  # 4 + 16; 17
    assert list(rows(r, "rollout")["start_s"]) == [0.0, 51.0]
    assert list(rows(r, "rollout")["source_line"]) == [1, 7]  # the step:N line of each block
    assert r.warnings == ["1 line skipped: 6 (not a veRL metrics line)"]  # key lines belong to their step


def test_verl_legacy_timing_keys_and_the_command_line():
    r = import_framework_log("verl", LOGS / "verl_legacy_timing.log", H800)
    assert r.config_file == "the command line at line 1"  # trainer.n_gpus_per_node=8 trainer.nnodes=1
    assert r.job == "deepseek_llm_7b_function_rm"  # trainer.experiment_name='...', quotes dropped
    assert (r.placement.rollout_gpus, r.placement.train_gpus) == (8, 8)
    assert list(rows(r, "rollout")["duration_s"]) == [45.63, 44.9, 46.5]  # timing/gen
    # ref + values + adv + update_critic + update_actor: 6.12+5.88+0.34+30.21+33.02, 6.1+5.9+0.3+30+33.3, 6+5.8+0.3+29.9+33.5
    assert list(rows(r, "train")["duration_s"]) == [75.57, 75.6, 75.5]
    assert list(rows(r, "rollout")["start_s"]) == [0.0, 121.2, 241.7]  # timing/step 121.2, 120.5
    assert list(rows(r, "rollout")["source_line"]) == [4, 5, 6]


def test_a_step_uses_one_key_generation(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("step:1 - timing_s/gen:10 - timing_s/update_actor:5 - timing/gen:99 - timing/update_actor:99\n"
                   "step:2 - timing/gen:11 - timing/update_actor:6 - timing/update_weights:0.5\n")
    r = import_framework_log("verl", log, ImportOptions(gpu_type="H800", train_gpus=8))
    assert list(r.records["duration_s"]) == [10.0, 5.0, 11.0, 6.0, 0.5]


def test_config_precedence_and_the_hybrid_engine(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=4 trainer.experiment_name=cli\n"
                   "step:1 - timing_s/gen:10 - timing_s/update_actor:5\n")
    r = import_framework_log("verl", log, H800)
    assert (r.placement.train_gpus, r.job) == (4, "cli")  # trainer.nnodes defaults to 1, as in veRL
    given = tmp_path / "given.yaml"
    given.write_text("trainer: {nnodes: 2, n_gpus_per_node: 8}\nrollout: {nnodes: 1, n_gpus_per_node: 8}\n"
                     "actor_rollout_ref: {hybrid_engine: false}\n")
    r = import_framework_log("verl", log, ImportOptions(gpu_type="H800", config=given))
    assert (r.placement.rollout_gpus, r.placement.train_gpus) == (8, 16) and r.config_file == str(given)
    assert r.job == "cli"  # given.yaml has no name: the command line's
    (tmp_path / "run.yaml").write_text("trainer: {nnodes: 3, n_gpus_per_node: 8}\nrollout: {nnodes: 1, n_gpus_per_node: 8}\n"
                                       "actor_rollout_ref: {hybrid_engine: true}\n")
    r = import_framework_log("verl", log, H800)  # the file beside the log comes before what the log prints
    assert (r.placement.rollout_gpus, r.placement.train_gpus) == (24, 24)  # hybrid engine: rollout.* ignored
    (tmp_path / "run.yaml").write_text("trainer: {nnodes: 1, n_gpus_per_node: 8}\nrollout: {nnodes: 0, n_gpus_per_node: 8}\n")
    assert import_framework_log("verl", log, H800).placement.rollout_gpus == 8  # a 0-node pool is no pool


def test_an_unexpanded_shell_variable_is_no_gpu_count(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("+ python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$GPUS_PER_NODE trainer.nnodes=$NNODES\n"
                   "python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=4 trainer.nnodes=2\n"
                   "step:1 - timing_s/gen:10 - timing_s/update_actor:5\n")
    r = import_framework_log("verl", log, H800)
    assert r.placement.train_gpus == 8 and r.config_file == "the command line at line 2"  # 2 x 4, line 1 says nothing


def test_no_gpu_count_anywhere_names_every_place_looked(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("python3 -m verl.trainer.main_ppo trainer.total_epochs=3\nstep:1 - timing_s/gen:10 - timing_s/update_actor:5\n")
    (tmp_path / "run.yaml").write_text("trainer: {experiment_name: x}\n")
    with pytest.raises(InputError, match=r"GPU counts unknown: .*run.yaml has no training GPU count"):
        import_framework_log("verl", log, H800)


def weave(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "weave_rl.cli.app", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_cli_import_without_config_equals_with_it(tmp_path):
    """weave profile import on a log that prints its config: the same records with and without --config."""
    config = tmp_path / "qwen.yaml"
    config.write_text("trainer: {experiment_name: qwen2_7b_grpo, nnodes: 2, n_gpus_per_node: 8}\n"
                      "actor_rollout_ref: {hybrid_engine: true}\n")
    outs = []
    for extra in ([], ["--config", str(config)]):
        out = tmp_path / f"rec{len(outs)}.csv"
        proc = weave("profile", "import", "--from", "verl", str(LOGS / "verl_ray_tqdm.log"), "-o", str(out),
                     "--gpu-type", "H800", *extra)
        assert proc.returncode == 0, proc.stderr
        assert "imported 3 steps of job qwen2_7b_grpo" in proc.stdout and "16 x H800" in proc.stdout
        where = str(config) if extra else "the config printed at line 2"
        assert f"GPU counts from {where}" in proc.stdout.replace("\n", "")
        outs.append(pd.read_csv(out))
    pd.testing.assert_frame_equal(outs[0], outs[1])
    assert len(outs[0]) == 6


# ----- OpenRLHF ----------------------------------------------------------------------------------

def test_openrlhf_sync_trainer_global_step_lines():
    r = import_framework_log("openrlhf", LOGS / "openrlhf_console.log", H800)
    assert r.job == "ppo-sync" and r.log_format == "console"
    assert (r.placement.rollout_gpus, r.placement.train_gpus) == (8, 8)  # 4 engines x TP 2; 1 x 8 actor
    assert list(rows(r, "rollout")["duration_s"]) == [120.0, 126.0]  # timing/generation
    assert list(rows(r, "train")["duration_s"]) == [115.0, 117.0]  # make_experience 20 + ppo_train 95; 21 + 96
    assert list(rows(r, "sync")["duration_s"]) == [4.0, 4.5]  # timing/broadcast
    # today's step_total is the sum of the timers (120+20+95+4 = 239): nothing taken out, phases in a row
    assert list(rows(r, "rollout")["start_s"]) == [0.0, 239.0]
    assert list(rows(r, "sync")["start_s"]) == [235.0, 482.0]
    assert list(rows(r, "rollout")["source_line"]) == [2, 4]
    assert r.warnings == ["2 lines skipped: 1, 3 (not an OpenRLHF metrics line)",
                          "1 line skipped: 5 (unreadable Global step status (expected a dict as Python prints it))"]


def test_openrlhf_async_trainer_overlaps_rollout_with_the_previous_step():
    r = import_framework_log("openrlhf", LOGS / "openrlhf_async.log", H800)
    assert r.job == "ppo-async"
    rollout, train, sync = rows(r, "rollout"), rows(r, "train"), rows(r, "sync")
    # durations as logged: no "generation inside make_experience" correction although
    # 100+15+60+5 > step_total for steps 2 and 3 (110, 81 s of wall time)
    assert list(rollout["duration_s"]) == [100.0, 110.0, 90.0]
    assert list(train["duration_s"]) == [75.0, 78.0, 76.0]
    # steps last their wall time: 0-180, 180-290, 290-371; train + broadcast end with the step
    assert list(sync["start_s"]) == [175.0, 285.0, 366.0]  # 180-5, 290-5, 371-5
    assert list(train["start_s"]) == [100.0, 207.0, 290.0]  # 175-75, 285-78, 366-76
    # the rollout ends where its train starts: step 2's generation (97-207) ran while step 1 trained (100-175)
    assert list(rollout["start_s"]) == [0.0, 97.0, 200.0]
    assert r.warnings[-1].startswith("3 steps of the async trainer: timing/step_total is wall time")


def test_openrlhf_async_is_recognised_by_line_form_keys_or_config(tmp_path):
    status = "{'timing/generation': 50.0, 'timing/make_experience': 60.0, 'timing/ppo_train': 30.0, 'timing/step_total': 90.0}"
    log = tmp_path / "run.log"
    opts = ImportOptions(gpu_type="H800", train_gpus=4, rollout_gpus=4)
    log.write_text(f"✨ Global step 1: {status}\n")
    sync = import_framework_log("openrlhf", log, opts)
    # sync trainer, 50+60+30 = 140 > 1.01 x 90: an older version that timed generation inside make_experience
    assert list(rows(sync, "train")["duration_s"]) == [40.0]  # 60 - 50 + 30
    assert list(sync.records["start_s"]) == [0.0, 50.0]
    log.write_text(f"Global step 1: {status}\n")  # the async trainer's line: no ✨
    first = import_framework_log("openrlhf", log, opts)
    assert list(rows(first, "train")["duration_s"]) == [90.0]  # 60 + 30, nothing taken out
    # laid out from the end: train 0-90, rollout -50-0, then shifted so the first row starts at 0
    assert list(first.records["start_s"]) == [0.0, 50.0]
    assert list(first.records["phase"]) == ["rollout", "train"]
    log.write_text(f"✨ Global step 1: {status[:-1]}, 'timing/actor_idle_wait': 0.0}}\n")
    assert list(rows(import_framework_log("openrlhf", log, opts), "train")["duration_s"]) == [90.0]  # idle-wait keys
    log.write_text(f"✨ Global step 1: {status}\n")
    (tmp_path / "run.yaml").write_text("train: {async_enable: true}\nactor: {num_nodes: 1, num_gpus_per_node: 4}\n")
    by_config = import_framework_log("openrlhf", log, ImportOptions(gpu_type="H800"))
    assert list(rows(by_config, "train")["duration_s"]) == [90.0] and by_config.placement.train_gpus == 4


# ----- ROLL --------------------------------------------------------------------------------------

def test_roll_rlvr_pipeline_keys_per_domain_and_no_switch_timers():
    r = import_framework_log("roll", LOGS / "roll_rlvr.log", H800)
    assert r.job == "qwen2.5-7B-rlvr" and (r.placement.rollout_gpus, r.placement.train_gpus) == (16, 16)
    sync, rollout, train = rows(r, "sync"), rows(r, "rollout"), rows(r, "train")
    assert list(rollout["duration_s"]) == [140.0, 150.0]  # time/step_generate
    # ref_log_probs_values + old_log_probs + get_sample_level_mask + per domain (math_rule, code_sandbox)
    # reward_postprocess + get_token_reward + compute_advantage + step_train:
    # 6.5+7+0.05+(0.2+0.1+0.3)+(0.1+0.05+0.2)+105 = 119.5; 6.4+7.1+0.05+(0.2+0.1+0.35)+(0.15+0.05+0.2)+104.4 = 119
    assert list(train["duration_s"]) == [119.5, 119.0]
    assert list(sync["duration_s"]) == [6.0, 6.2]  # time/step_model_update, first in the step
    assert list(sync["start_s"]) == [0.0, 265.5]
    assert (r.records["switch_s"] == 0).all()
    assert r.warnings == ["2 lines skipped: 1, 3 (not a ROLL metrics line)",
                          "no step logs onload/offload timers (time/<cluster>/<method>/onload|offload; ROLL logs them "
                          "only at debug level): switch_s taken as 0 there, so the switch stays inside the phase times"]


def test_roll_switch_warning_counts_the_steps_without_timers(tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text('{"step": 0, "metrics": {"time/step_generate": 10, "time/step_train": 5, '
                   '"time/actor_train/train_step/onload": 1.0}}\n'
                   '{"step": 1, "metrics": {"time/step_generate": 10, "time/step_train": 5, "time/compute_advantage": 0.5}}\n')
    r = import_framework_log("roll", log, ImportOptions(gpu_type="H800", train_gpus=8))
    assert list(rows(r, "train")["duration_s"]) == [4.0, 5.5]  # 5 - 1 s onload (switch_s 1); 5 + 0.5 advantage
    assert list(rows(r, "train")["switch_s"]) == [1.0, 0.0]
    assert r.warnings == ["1 of 2 steps log no onload/offload timers (time/<cluster>/<method>/onload|offload; ROLL logs "
                          "them only at debug level): switch_s taken as 0 there, so the switch stays inside the phase times"]
