"""``weave_rl.profiles.importers``: each framework's example log -> records, value by value (checkable by hand
from ``examples/logs``), and the skip / error rules."""

from pathlib import Path

import pytest

from weave_rl.profiles.importers import IMPORTERS, ImportOptions, import_framework_log
from weave_rl.profiles.importers.config import lookup
from weave_rl.profiles.importers.roll import device_mapping
from weave_rl.profiles.importers.verl import parse_console
from weave_rl.profiles.records import validate_records
from weave_rl.core.errors import InputError

LOGS = Path(__file__).resolve().parent.parent / "examples" / "logs"
SPLIT = ImportOptions(gpu_type="rollout=H20,train=H800")


def rows(result, phase):
    frame = result.records
    return frame[frame["phase"] == phase].reset_index(drop=True)


def test_verl_console_maps_timing_keys_onto_phases():
    r = import_framework_log("verl", LOGS / "verl_console.log", SPLIT)
    assert r.job == "A1"  # trainer.experiment_name in verl_console.yaml
    assert r.config_file.endswith("verl_console.yaml")
    assert (r.placement.rollout_gpus, r.placement.train_gpus) == (8, 8)
    rollout, train, sync = rows(r, "rollout"), rows(r, "train"), rows(r, "sync")
    assert list(rollout["iteration"]) == [1, 2, 3]
    assert list(rollout["duration_s"]) == [130.0, 140.0, 150.0]  # timing_s/gen (np.float64(...) in step 2)
    # train = reward 2 + old_log_prob 6 + ref 5 + adv 0.5 + update_actor (100, 103.5, 106.5)
    assert list(train["duration_s"]) == [113.5, 117.0, 120.0]
    assert list(sync["duration_s"]) == [5.5, 5.6, 5.4]  # timing_s/update_weights
    # start_s: steps start at 0, 249 (timing_s/step of step 1), 249 + 282.6 (testing included)
    assert list(rollout["start_s"]) == [0.0, 249.0, 531.6]
    assert list(train["start_s"]) == [130.0, 389.0, 681.6]
    assert list(sync["start_s"]) == [243.5, 506.0, 801.6]
    # tokens = gen s * 1000 / timing_per_token_ms/gen (0.1 ms)
    assert list(rollout["tokens"]) == [1_300_000, 1_400_000, 1_500_000]
    assert train["tokens"].isna().all()
    assert set(r.records["gpu_type"]) == {"H20", "H800"}
    assert list(train["gpu_type"].unique()) == ["H800"] and list(sync["gpu_type"].unique()) == ["H20"]
    assert (r.records["switch_s"] == 0).all()
    assert r.warnings == ["4 lines skipped: 1, 3, 5, 9 (not a veRL metrics line)",
                          "1 line skipped: 2 (the run's printed config, not a step)",
                          "1 line skipped: 8 (unreadable value 'oops' for timing_s/gen)"]
    validate_records(r.records)  # the DESIGN 3.4 contract holds


def test_verl_file_logger_jsonl_colocated():
    r = import_framework_log("verl", LOGS / "verl_file_logger.jsonl", ImportOptions(gpu_type="H800"))
    assert r.job == "colocated-7b" and r.log_format == "jsonl"
    # hybrid engine: no rollout.* keys, so rollout shares trainer.nnodes 2 x n_gpus_per_node 8
    assert set(r.records["gpus"]) == {16}
    assert list(rows(r, "rollout")["duration_s"]) == [64.0, 66.0]
    assert list(rows(r, "train")["duration_s"]) == [56.5, 58.0]  # 1 + 3 + 2.5 + 50 / 51.5
    assert rows(r, "sync").empty  # no timing_s/update_weights: no sync rows
    assert list(rows(r, "rollout")["start_s"]) == [0.0, 120.5]
    assert r.warnings == ["1 line skipped: 3 (malformed JSON: Expecting ',' delimiter)"]


def test_verl_csv_export_flat_dotted_config_and_empty_row():
    r = import_framework_log("verl", LOGS / "verl_wandb_export.csv", SPLIT)
    assert r.job == "B1" and r.log_format == "csv"
    assert (r.placement.rollout_gpus, r.placement.train_gpus) == (16, 8)  # rollout.nnodes 2 x 8, trainer 1 x 8
    assert list(rows(r, "rollout")["iteration"]) == [1, 3]
    assert list(rows(r, "train")["duration_s"]) == [101.0, 104.0]
    assert list(rows(r, "sync")["gpus"]) == [16, 16]  # sync lands on the rollout GPUs
    assert r.warnings == ["1 line skipped: 3 (step without timing_s/gen (or timing/gen))"]


def test_roll_stdout_switch_times_and_sync_first():
    r = import_framework_log("roll", LOGS / "roll_stdout.log", SPLIT)
    assert r.job == "A1"  # exp_name
    assert (r.placement.rollout_gpus, r.placement.train_gpus) == (8, 8)  # len(list(range(8,16))), len(range(0,8))
    rollout, train, sync = rows(r, "rollout"), rows(r, "train"), rows(r, "sync")
    # rollout = time/step_generate - actor_infer offload 2.0
    assert list(rollout["duration_s"]) == [136.0, 144.0, 130.0]
    assert list(rollout["switch_s"]) == [2.0, 2.0, 2.0]
    # train = ref 6 + old_log_probs (7, 7, 7.5) + step_train (105, 108, 104.5) - actor_train onload 1.5 + offload 1.0
    assert list(train["duration_s"]) == [115.5, 118.5, 115.5]
    assert list(train["switch_s"]) == [2.5, 2.5, 2.5]
    assert list(sync["duration_s"]) == [6.0, 6.2, 6.1]
    # ROLL syncs first: sync at the step start, rollout after sync + its switch, train after rollout + switch
    assert list(sync["start_s"]) == [0.0, 262.0, 535.2]
    assert list(rollout["start_s"]) == [8.0, 270.2, 543.3]
    assert list(train["start_s"]) == [146.5, 416.7, 675.8]
    assert r.warnings == ["2 lines skipped: 1, 3 (not a ROLL metrics line)",
                          "1 line skipped: 6 (malformed metrics_tag JSON: Expecting ',' delimiter)"]


def test_openrlhf_jsonl_prefix_and_nested_generation():
    r = import_framework_log("openrlhf", LOGS / "openrlhf_wandb.jsonl", SPLIT)
    assert r.job == "A2"  # logger.wandb.run_name
    assert (r.placement.rollout_gpus, r.placement.train_gpus) == (8, 8)  # vllm 4 engines x TP 2; actor 1 x 8
    assert list(rows(r, "rollout")["duration_s"]) == [120.0, 126.0, 118.0]
    # make_experience + ppo_train; step 3 timed generation inside make_experience (sum > step_total): 138-118+97
    assert list(rows(r, "train")["duration_s"]) == [115.0, 117.0, 117.0]
    assert list(rows(r, "sync")["duration_s"]) == [4.0, 4.2, 4.1]
    assert list(rows(r, "rollout")["start_s"]) == [0.0, 239.5, 487.0]  # timing/step_total
    assert r.warnings == ["1 line skipped: 4 (not an OpenRLHF metrics line)",
                          "1 line skipped: 5 (step without timing/generation)"]


def test_options_override_config_and_name_the_job(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("step:0 - timing_s/gen:10 - timing_s/update_actor:5\n")
    r = import_framework_log("verl", log, ImportOptions(job="X", gpu_type="H100", train_gpus=4, rollout_gpus=2))
    assert r.job == "X" and r.config_file is None
    assert list(r.records["gpus"]) == [2, 4] and list(r.records["gpu_type"]) == ["H100", "H100"]
    assert r.warnings == []


def test_duplicate_steps_keep_the_first(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("step:1 - timing_s/gen:10 - timing_s/update_actor:5\nstep:1 - timing_s/gen:99 - timing_s/update_actor:5\n")
    r = import_framework_log("verl", log, ImportOptions(gpu_type="H100", train_gpus=8))
    assert list(rows(r, "rollout")["duration_s"]) == [10.0]
    assert r.warnings == ["1 line skipped: 2 (step 1 again (first at line 1; the first is kept))"]


def test_many_skipped_lines_are_listed_ten_then_dots(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("".join(f"noise {i}\n" for i in range(12)) + "step:1 - timing_s/gen:10 - timing_s/update_actor:5\n")
    r = import_framework_log("verl", log, ImportOptions(gpu_type="H100", train_gpus=8))
    assert r.warnings == ["12 lines skipped: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... (not a veRL metrics line)"]


@pytest.mark.parametrize("text, reason", [
    ("", "no usable veRL step (the file is empty)"),
    ("hello\nworld\n", "no usable veRL step (2 lines skipped: 1, 2 (not a veRL metrics line))"),
    ("step:1 - actor/lr:0.1\n", "no usable veRL step (1 line skipped: 1 (step without timing_s/gen (or timing/gen)))"),
])
def test_a_log_without_a_usable_step_is_an_error(tmp_path, text, reason):
    log = tmp_path / "bad.log"
    log.write_text(text)
    with pytest.raises(InputError) as err:
        import_framework_log("verl", log, ImportOptions(gpu_type="H100", train_gpus=8))
    assert str(err.value) == f"{log}: {reason}"


def test_missing_gpu_counts_and_types_are_errors(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("step:1 - timing_s/gen:10 - timing_s/update_actor:5\n")
    with pytest.raises(InputError, match="GPU counts unknown: no config found next to the log"):
        import_framework_log("verl", log, ImportOptions(gpu_type="H100"))
    with pytest.raises(InputError, match="--gpu-type: required"):
        import_framework_log("verl", log, ImportOptions(train_gpus=8))
    with pytest.raises(InputError, match="--gpu-type: name both rollout= and train="):
        import_framework_log("verl", log, ImportOptions(train_gpus=8, gpu_type="rollout=H20"))
    (tmp_path / "run.yaml").write_text("trainer: {nnodes: two, n_gpus_per_node: 8}\n")
    with pytest.raises(InputError, match=r"run.yaml: trainer.nnodes: expected a positive integer \(got 'two'\)"):
        import_framework_log("verl", log, ImportOptions(gpu_type="H100"))
    with pytest.raises(InputError, match="unknown framework 'slime'"):
        import_framework_log("slime", log, ImportOptions(gpu_type="H100"))


def test_parsers_and_helpers():
    assert parse_console("(TaskRunner pid=1) step:7 - timing_s/gen:np.float64(1.5) - x:2") == (7, {"timing_s/gen": 1.5, "x": 2.0})
    assert parse_console("Training Progress: 7/10") is None
    with pytest.raises(ValueError, match="malformed veRL metrics line"):
        parse_console("step:7 - timing_s/gen 1.5")
    assert device_mapping("list(range(8,16))", "k", "f") == list(range(8, 16))
    assert device_mapping("list(range(0, 8, 2))", "k", "f") == [0, 2, 4, 6]
    assert device_mapping("[1, 3]", "k", "f") == [1, 3]
    with pytest.raises(InputError, match="f: k: expected list"):
        device_mapping("__import__('os')", "k", "f")
    assert lookup({"a": {"b": 1}, "c.d": 2}, "a.b") == 1 and lookup({"c.d": 2}, "c.d") == 2
    assert sorted(IMPORTERS) == ["openrlhf", "roll", "verl"]
