"""Packaging: one import package, ``weave_rl``, for the whole distribution.

The project's layers stay folders at the top of the repository (topology/, profiles/, planner/,
executor/) but install as ``weave_rl.topology``, ``weave_rl.profiles``, ... so that no generic
top-level module (``planner``, ``executor``, ``weave``) lands in site-packages. Metadata lives in
pyproject.toml; only the package map is here, because it is computed from the folders.
"""

from setuptools import find_packages, setup

ROOT = "weave_rl"
LAYERS = ("topology", "profiles", "planner", "executor")

packages = find_packages(include=[ROOT, f"{ROOT}.*"])
package_dir = {ROOT: ROOT}
for layer in LAYERS:
    package_dir[f"{ROOT}.{layer}"] = layer
    packages += [f"{ROOT}.{name}" for name in find_packages(include=[layer, f"{layer}.*"])]

setup(packages=packages, package_dir=package_dir)
