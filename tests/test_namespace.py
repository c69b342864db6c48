"""One import package: everything installs under ``weave_rl``; layers import downward only.

- the modules' imports, read from the source (every level, lazy ones included), form no cycle, never
  reach into the CLI from a library module, and go from a layer only to the ones below it;
- no code of the repository imports a generic top-level name (``planner``, ``executor``, ...);
- other packages' top-level ``weave`` and ``executor`` (W&B's tracing library, PyPI's executor)
  first on ``sys.path`` break nothing: ``weave plan`` still works, from the editable install and
  from a built wheel, and the stand-ins stay what they are.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "weave_rl"
# Layers in import order: a module may import its own layer and the ones before it.
LAYERS = ("core", "topology", "profiles", "planner", "executor", "cli")
# The folders at the top of the repository that install as weave_rl.<folder>.
TOP_FOLDERS = ("topology", "profiles", "planner", "executor")
GENERIC = {"weave", "planner", "executor", "profiles", "topology"}


def library_modules() -> dict[str, Path]:
    """Installed module name -> source file, as setup.py maps the folders."""
    out: dict[str, Path] = {}
    roots = [(ROOT / PACKAGE, PACKAGE)] + [(ROOT / f, f"{PACKAGE}.{f}") for f in TOP_FOLDERS]
    for folder, prefix in roots:
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = path
    return out


MODULES = library_modules()


def runtime_nodes(tree: ast.AST):
    """Every node of the tree except those under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imported_names(path: Path, module: str) -> list[str]:
    """Every module name an ``import`` in the file names, at any depth, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    names = []
    for node in runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names.append(source)
            names += [f"{source}.{alias.name}" for alias in node.names]  # submodules, when they are
    return names


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for module, path in MODULES.items():
        for name in imported_names(path, module):
            if name in MODULES and name != module:
                graph.add_edge(module, name)
    return graph


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_walk_sees_the_whole_package():
    graph = import_graph()
    assert len(MODULES) > 100
    for name in ("weave_rl.cli.app", "weave_rl.core.errors", "weave_rl.planner.optimize",
                 "weave_rl.executor.local.worker", "weave_rl.planner.export.k8s"):
        assert name in MODULES
    assert graph.has_edge("weave_rl.planner.online", "weave_rl.planner.optimize")
    assert graph.has_edge("weave_rl.core.yamlio", "weave_rl.core.errors")


def test_no_import_cycles():
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert cycles == []


def test_no_library_module_imports_the_cli():
    upward = [(a, b) for a, b in import_graph().edges if b.startswith(f"{PACKAGE}.cli")
              and not a.startswith(f"{PACKAGE}.cli") and a not in (PACKAGE, f"{PACKAGE}.__main__")]
    assert upward == []


def test_layers_import_only_downward():
    upward = []
    for a, b in import_graph().edges:
        la, lb = layer_of(a), layer_of(b)
        if la is not None and lb is not None and lb > la:
            upward.append(f"{a} -> {b}")
    assert upward == []


def test_no_code_imports_a_generic_top_level_name():
    offenders = []
    for path in ROOT.rglob("*.py"):
        if any(part.startswith(".") or part in ("build", "out") for part in path.relative_to(ROOT).parts):
            continue
        for name in imported_names(path, "x.y"):
            if name.split(".")[0] in GENERIC:
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


# ----- stand-in packages of the same top-level names first on sys.path -------------------------

STAND_INS = {
    # W&B's tracing library ships a top-level ``weave``; PyPI's ``executor`` a top-level ``executor``.
    "weave": "def init(project):\n    return f'traced {project}'\n",
    "executor": "NAME = 'the other executor'\n",
    "planner": "NAME = 'another planner'\n",
}


def make_stand_ins(folder: Path) -> Path:
    for name, body in STAND_INS.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(body)
    return folder


def run_weave_beside_stand_ins(stand_ins: Path, cwd: Path, args: list[str], path_first: list[Path] = ()):
    """``weave ARGS`` in a fresh interpreter whose sys.path starts with the stand-ins."""
    script = textwrap.dedent(f"""
        import json, sys
        sys.path[:0] = {json.dumps([str(p) for p in [*path_first, stand_ins]])}
        import weave, executor, planner
        from weave_rl.cli.app import app
        try:
            app({json.dumps(args)}, prog_name="weave")
        except SystemExit as exc:
            code = exc.code or 0
        import weave_rl, weave_rl.planner.plan
        print(json.dumps({{"code": code, "weave": weave.init("p"), "executor": executor.NAME,
                          "planner": planner.NAME, "package": weave_rl.__file__,
                          "plan_module": weave_rl.planner.plan.__file__,
                          "clobbered": sorted(m for m in sys.modules if m.split(".")[0] in
                                              ("weave", "executor", "planner") and "." in m)}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def plan_args(out: Path) -> list[str]:
    inputs = ROOT / "plans" / "inputs"
    return ["plan", "--topology", str(inputs / "micro-a.topology.yaml"), "--jobs", str(inputs / "micro-a.jobs.yaml"),
            "--time-limit", "10", "-o", str(out)]


def check_result(result: dict, plan_file: Path) -> None:
    assert result["code"] == 0
    assert plan_file.exists() and "groups:" in plan_file.read_text()
    # Both sides intact: the stand-ins answer as themselves, ours loaded none of their submodules.
    assert result["weave"] == "traced p" and result["executor"] == "the other executor"
    assert result["planner"] == "another planner"
    assert result["clobbered"] == []


def test_weave_plan_works_beside_other_weave_and_executor_packages(tmp_path):
    stand_ins = make_stand_ins(tmp_path / "site")
    plan_file = tmp_path / "plan.yaml"
    result = run_weave_beside_stand_ins(stand_ins, tmp_path, plan_args(plan_file))
    check_result(result, plan_file)
    assert Path(result["plan_module"]).resolve() == (ROOT / "planner" / "plan.py").resolve()


def test_the_built_wheel_installs_one_top_level_package_that_works_beside_stand_ins(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("weave_rl-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(tmp_path / "installed")
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {PACKAGE}
    for module in ("weave_rl/planner/optimize.py", "weave_rl/executor/local/worker.py",
                   "weave_rl/planner/export/k8s.py", "weave_rl/cli/app.py", "weave_rl/core/errors.py"):
        assert module in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "weave = weave_rl.cli.app:run" in (tmp_path / "installed" / entry).read_text()

    stand_ins = make_stand_ins(tmp_path / "site")
    plan_file = tmp_path / "plan.yaml"
    result = run_weave_beside_stand_ins(stand_ins, tmp_path, plan_args(plan_file),
                                        path_first=[tmp_path / "installed"])
    check_result(result, plan_file)
    assert Path(result["package"]).is_relative_to(tmp_path / "installed")
    assert Path(result["plan_module"]).is_relative_to(tmp_path / "installed")


def test_the_readme_python_example_runs(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### One import package"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[:code.index("```")]
    assert "from weave_rl import" in code
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "inputs").symlink_to(ROOT / "plans" / "inputs")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "plans" / "mine.yaml").exists()


def test_public_api_names_resolve():
    import weave_rl

    assert weave_rl.Workload.__module__ == "weave_rl.executor.workload"
    assert weave_rl.make_plan.__module__ == "weave_rl.planner.api"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        weave_rl.nothing  # noqa: B018
