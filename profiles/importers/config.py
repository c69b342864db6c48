"""The training config next to a log: where to find it and how to read dotted keys from it.

Frameworks keep GPU counts in their config, not in the metrics (veRL ``trainer.nnodes``, ROLL
``actor_train.device_mapping``, OpenRLHF ``--actor.num_nodes``). ``find_config`` looks for, in
order: the ``--config`` file; ``<log stem>.yaml|.yml|.json`` beside the log; ``config.yaml`` beside
the log; Hydra's ``.hydra/config.yaml`` beside the log. Keys may be nested (``trainer: {nnodes: 2}``)
or flat dotted (``trainer.nnodes: 2``, as Hydra overrides are written).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from weave_rl.core.errors import InputError
from weave_rl.core.yamlio import load_yaml_file, read_text_file

_MISSING = object()


def find_config(log: Path, given: Path | None) -> Path | None:
    if given is not None:
        if not given.exists():
            raise InputError(str(given), None, "config file not found")
        return given
    candidates = [log.with_suffix(s) for s in (".yaml", ".yml", ".json")]
    candidates += [log.parent / "config.yaml", log.parent / ".hydra" / "config.yaml"]
    return next((c for c in candidates if c.is_file() and c != log), None)


def load_config(path: Path | None) -> dict:
    if path is None:
        return {}
    if path.suffix.lower() == ".json":
        text = read_text_file(path, "JSON config")  # size, encoding and read errors name the file
        try:
            data = json.loads(text)
        except RecursionError:
            raise InputError(str(path), None, "cannot read JSON config: nested too deeply") from None
        except json.JSONDecodeError as exc:
            raise InputError(str(path), None, f"cannot read JSON config: {exc}") from None
    else:
        data = load_yaml_file(path)
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise InputError(str(path), None, "expected a mapping of config keys")
    return dict(data)


def lookup(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """``trainer.nnodes`` from nested mappings, from a flat ``trainer.nnodes`` key, or from a mix."""
    if dotted in config:
        return config[dotted]
    head, sep, rest = dotted.partition(".")
    while sep:
        node = config.get(head, _MISSING)
        if isinstance(node, Mapping):
            found = lookup(node, rest, _MISSING)
            if found is not _MISSING:
                return found
        more, sep, rest = rest.partition(".")
        head = f"{head}.{more}" if sep or more else head
    return default


def positive_int(config: Mapping[str, Any], key: str, file: str) -> int | None:
    """An optional positive integer config value (``None`` when absent); InputError naming the key otherwise."""
    value = lookup(config, key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit() or int(value) <= 0:
        raise InputError(file, key, f"expected a positive integer (got {value!r})")
    if int(value) > 100_000:
        raise InputError(file, key, f"expected at most 100,000 GPUs (got {value!r})")
    return int(value)
