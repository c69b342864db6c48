"""Import phase timings from RL frameworks' logs into Weave's measured records (DESIGN 3.4).

``weave profile import --from verl|roll|openrlhf LOG -o records.parquet``; one module per framework
(its key -> phase table is in the module's docstring), one shared reader (``metrics``), config
lookup (``config``) and record builder (``builder``).
"""

from __future__ import annotations

from pathlib import Path

from weave_rl.profiles.importers import openrlhf, roll, verl
from weave_rl.profiles.importers.base import CLI, ImportOptions, ImportResult, Importer, import_log
from weave_rl.core.errors import InputError

IMPORTERS: dict[str, Importer] = {m.NAME: m for m in (verl, roll, openrlhf)}  # type: ignore[misc]

__all__ = ["IMPORTERS", "ImportOptions", "ImportResult", "import_framework_log"]


def import_framework_log(framework: str, log: Path, options: ImportOptions = ImportOptions()) -> ImportResult:
    importer = IMPORTERS.get(framework)
    if importer is None:
        raise InputError(CLI, "--from", f"unknown framework {framework!r} (frameworks: {', '.join(IMPORTERS)})")
    return import_log(importer, log, options)
