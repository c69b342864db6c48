"""Workload kinds from the user's code: an import string ``package.module:Class`` or a name of the
``weave.workloads`` entry-point group, resolved by each process itself; a kind that cannot be
imported or is not a Workload is one line naming the jobs file and ``jobs[i].workload.kind``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from weave_rl.core.errors import InputError
from weave_rl.executor import workload as wmod
from weave_rl.executor.workload import OptionError, Workload, build_workload, check_workload, workload_factory

MODULE = '''
from weave_rl import Workload, phase
from weave_rl.executor.workload import OptionError


class Counter(Workload):
    """Enough of a workload to be built and to check its options."""

    @classmethod
    def check_options(cls, options, base):
        if not isinstance(options.get("size", 1), int):
            raise OptionError("size", f"must be an integer, got {options['size']!r}")
        return {**options, "base": str(base)}

    def initial_state(self, role):
        return {}

    def to_device(self, role, state, device):
        pass

    def to_host(self, role):
        return {}

    def state_bytes(self, role):
        return 0

    def policy_weights(self):
        return {}

    def load_policy_weights(self, weights):
        pass

    @phase("rollout")
    def rollout(self, iteration, shard, shards):
        return None

    @phase("reward")
    def reward(self, samples):
        return samples

    @phase("train")
    def train(self, iteration, samples, all_reduce):
        return {}


class Half(Workload):
    def initial_state(self, role):
        return {}


class NoPhases(Counter):
    rollout = reward = train = None


def make_counter():
    return Counter


NOT_A_CLASS = 3
'''


@pytest.fixture
def user_code(tmp_path, monkeypatch):
    """A package of the user's on sys.path (what PYTHONPATH gives every process), forgotten afterwards."""
    pkg = tmp_path / "user_jobs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kinds.py").write_text(textwrap.dedent(MODULE))
    (pkg / "broken.py").write_text("import definitely_not_installed_xyz\n")
    (pkg / "raises.py").write_text("raise RuntimeError('config missing')\n")
    dist = tmp_path / "user_jobs-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: user-jobs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[weave.workloads]\ncounter = user_jobs.kinds:Counter\n"
                                           "half = user_jobs.kinds:Half\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = dict(wmod._REGISTRY)
    yield tmp_path
    wmod._REGISTRY.clear()
    wmod._REGISTRY.update(saved)
    import sys

    for name in [m for m in sys.modules if m == "user_jobs" or m.startswith("user_jobs.")]:
        del sys.modules[name]


def test_import_string_builds_the_users_class(user_code):
    wl = build_workload("A", {"kind": "user_jobs.kinds:Counter", "size": 4, "seed": 9})
    from user_jobs.kinds import Counter

    assert type(wl) is Counter and wl.job == "A" and wl.seed == 9 and wl.options == {"size": 4}
    assert set(wl.phases()) == {"rollout", "reward", "train"}


def test_entry_point_builds_the_installed_class(user_code):
    wl = build_workload("A", {"kind": "counter"})
    assert type(wl).__module__ == "user_jobs.kinds" and type(wl).__name__ == "Counter"
    with pytest.raises(ValueError, match="unknown workload kind 'nope' \\(known: bandit, counter, grpo, half"):
        workload_factory("nope")


@pytest.mark.parametrize("kind, message", [
    ("user_jobs.missing:Counter", "cannot import 'user_jobs.missing' (ModuleNotFoundError: No module named "
                                  "'user_jobs.missing') (is its folder on PYTHONPATH, or its package installed?)"),
    ("user_jobs.broken:Counter", "cannot import 'user_jobs.broken' (ModuleNotFoundError: No module named "
                                 "'definitely_not_installed_xyz')"),
    ("user_jobs.raises:Counter", "importing 'user_jobs.raises' failed (RuntimeError: config missing)"),
    ("user_jobs.kinds:Nope", "module 'user_jobs.kinds' has no attribute 'Nope'"),
    ("user_jobs.kinds:NOT_A_CLASS", "is not a weave_rl.Workload subclass (it is a int)"),
    ("user_jobs.kinds:make_counter", "is not a weave_rl.Workload subclass (it is a function)"),
    ("user_jobs.kinds:OptionError", "is not a weave_rl.Workload subclass (it is a class OptionError)"),
    ("user_jobs.kinds:Half", "does not implement load_policy_weights, policy_weights, state_bytes, to_device, "
                             "to_host (abstract methods of Workload)"),
    ("user_jobs.kinds:NoPhases", "registers no reward, rollout, train function (decorate it with @phase)"),
    ("user_jobs.kinds:", "is not of the form package.module:ClassName"),
    ("half", "entry point (weave.workloads) 'half': user_jobs.kinds:Half does not implement"),
])
def test_unusable_kinds_say_why(user_code, kind, message):
    with pytest.raises(ValueError) as info:
        workload_factory(kind)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert kind not in wmod._REGISTRY


def test_check_options_of_a_users_class_runs_in_the_controller(user_code):
    block = check_workload({"kind": "user_jobs.kinds:Counter", "seed": 2, "size": 3}, Path("/jobs"))
    assert block == {"kind": "user_jobs.kinds:Counter", "seed": 2, "size": 3, "base": "/jobs"}
    with pytest.raises(OptionError, match="must be an integer, got 'big'") as info:
        check_workload({"kind": "user_jobs.kinds:Counter", "size": "big"}, Path("/jobs"))
    assert info.value.key == "size"
    with pytest.raises(OptionError, match="must be an integer, got 'x'"):
        check_workload({"kind": "user_jobs.kinds:Counter", "seed": "x"}, Path("/jobs"))


def test_base_class_accepts_options():
    assert Workload.check_options({"a": 1}, Path(".")) is None


@pytest.mark.parametrize("kind, key, needle", [
    ("user_jobs.kinds:Half", "jobs[0].workload.kind", "user_jobs.kinds:Half does not implement"),
    ("user_jobs.nope:X", "jobs[0].workload.kind", "cannot import 'user_jobs.nope'"),
])
def test_run_inputs_name_file_and_key(user_code, tmp_path, kind, key, needle):
    from tests.test_local_run import write_inputs
    from weave_rl.executor.inputs import load_run_inputs

    plan, jobs = write_inputs(tmp_path / "in")
    jobs.write_text(jobs.read_text().replace("kind: bandit", f"kind: '{kind}'", 1))
    with pytest.raises(InputError) as info:
        load_run_inputs(plan, jobs, None)
    assert str(info.value).startswith(f"{jobs}: {key}: ") and needle in str(info.value), str(info.value)
