"""Reading YAML files with errors that name the file and the line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from weave_rl.core.errors import InputError


def load_yaml_file(path: str | Path) -> Any:
    path = Path(path)
    if not path.exists():
        raise InputError(str(path), None, "file not found")
    if path.is_dir():
        raise InputError(str(path), None, "is a directory, expected a YAML file")
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(str(path), None, f"cannot read: {exc.strerror}") from None
    return parse_yaml(text, str(path))


def parse_yaml(text: str, name: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise InputError(name, None, f"malformed YAML: {where}{problem}") from None


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)
