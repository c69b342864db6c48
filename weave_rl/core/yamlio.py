"""Reading and writing YAML files with errors that name the file and the line.

Reading is guarded: a file larger than ``max_input_bytes()`` (``WEAVE_MAX_INPUT_MB``, default 8 MB)
is refused before it is read, the text must be UTF-8, a mapping may not repeat a key (the later value
would silently win), and aliases may not expand the document past ``MAX_NODES`` values (a "billion laughs" file). Numbers like
``1e5`` are floats (as in YAML 1.2; PyYAML alone reads them as strings).

Writing goes through a temporary file beside the target, renamed into place; on any failure (a full
disk, a directory in the way) the temporary file is removed and the error names the file.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import yaml

from weave_rl.core.errors import InputError

DEFAULT_MAX_INPUT_MB = 8  # ~8000 jobs, or a plan of as many; parsing 8 MB of YAML takes seconds already
MAX_NODES = 2_000_000  # values in one document once aliases are expanded


def max_input_bytes() -> int:
    """The largest input file read (bytes): ``WEAVE_MAX_INPUT_MB`` megabytes, default 8."""
    text = os.environ.get("WEAVE_MAX_INPUT_MB", "")
    try:
        mb = float(text) if text else DEFAULT_MAX_INPUT_MB
    except ValueError:
        mb = DEFAULT_MAX_INPUT_MB
    return int(mb * 1_000_000) if mb > 0 else int(DEFAULT_MAX_INPUT_MB * 1_000_000)


def read_text_file(path: str | Path, what: str = "file", limit: int | None = None) -> str:
    """The UTF-8 text of an input file, or an ``InputError`` naming it (missing, a directory, too large,
    unreadable, not UTF-8)."""
    path = Path(path)
    name = str(path)
    limit = max_input_bytes() if limit is None else limit
    try:
        if not path.exists():
            raise InputError(name, None, "file not found")
        if path.is_dir():
            raise InputError(name, None, f"is a directory, expected a {what}")
        size = path.stat().st_size
        if size > limit:
            raise InputError(name, None, f"file too large ({size / 1e6:.1f} MB; the limit is {limit / 1e6:g} MB, "
                             "set WEAVE_MAX_INPUT_MB to raise it)")
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise InputError(name, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:  # a pipe or special file that reported no size
        raise InputError(name, None, f"file too large (over {limit / 1e6:g} MB; set WEAVE_MAX_INPUT_MB to raise it)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(name, None, f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line} "
                         f"(offset {exc.start}); save the file as UTF-8") from None


def load_yaml_file(path: str | Path) -> Any:
    return parse_yaml(read_text_file(path, "YAML file"), str(path))


_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """Safe loading, YAML 1.2 floats (``1e5``), no repeated keys."""


_FLOAT_12 = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789"))


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:  # the keys written here (a ``<<`` merge may be overridden)
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a plain value",
                                                    key_node.start_mark) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice in one mapping",
                                                    key_node.start_mark)
        seen.add(key)
    loader.flatten_mapping(node)
    out: dict = {}
    for key_node, value_node in node.value:
        out[loader.construct_object(key_node, deep=deep)] = loader.construct_object(value_node, deep=deep)
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, name: str) -> Any:
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise InputError(name, None, f"malformed YAML: {where}{problem}") from None
    except RecursionError:
        raise InputError(name, None, "malformed YAML: nested too deeply") from None
    if "*" in text and _expanded_size(data, MAX_NODES) > MAX_NODES:  # only aliases (*name) can blow it up
        raise InputError(name, None, f"YAML aliases expand to over {MAX_NODES:,} values; write the values out")
    return data


def _expanded_size(data: Any, budget: int) -> int:
    """Values in ``data`` counting each alias's copy again; stops counting past ``budget``."""
    count, stack = 0, [data]
    while stack and count <= budget:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
            count += len(item)
        elif isinstance(item, list):
            stack.extend(item)
    return count


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)


def write_text_file(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, renamed into place).

    Any failure is an ``InputError`` naming the file ("no space left on device" for a full disk),
    and the temporary file is removed.
    """
    path = Path(path)
    name = str(path)
    if path.is_dir():
        raise InputError(name, None, "is a directory; give a file name to write")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError(name, None, f"cannot write: {describe_os_error(exc)}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


def atomic_write(path: str | Path, write: Callable[[Path], Any], *, min_free_bytes: int = 1 << 20) -> Path:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it into place.

    On any failure the temporary file is removed. A failure on a full disk is raised as
    ``OSError(ENOSPC, "No space left on device", path)`` even when the writer hid the cause (torch's
    ``basic_ios::clear: iostream error`` is a RuntimeError): the file system is asked for its free
    space. Other errors propagate as they are. For executors saving checkpoints and sample shards.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or _nearly_full(path, min_free_bytes):
            raise OSError(errno.ENOSPC, "No space left on device", str(path)) from exc
        raise
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
    return path


def _nearly_full(path: Path, min_free_bytes: int) -> bool:
    for folder in [path.parent, *path.parent.parents]:
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free < min_free_bytes
            except OSError:
                return False
    return False


def describe_os_error(exc: OSError, with_file: bool = False) -> str:
    """A one-line reason for an OS error (``with_file``: led by the file it names); a full disk says so."""
    if exc.errno == errno.ENOSPC:
        text = "no space left on device"
    elif exc.errno == errno.EDQUOT:
        text = "disk quota exceeded"
    else:
        text = exc.strerror or str(exc)
    if with_file and getattr(exc, "filename", None):
        return f"{exc.filename}: {text}"
    return text


_VIRTUAL = ("/proc", "/sys", "/dev")


def _virtual(path: Path) -> bool:
    text = str(path.resolve()) if path.is_absolute() or path.exists() else str(Path.cwd() / path)
    return any(text == v or text.startswith(v + "/") for v in _VIRTUAL)


def check_output_file(path: str | Path, option: str) -> Path:
    """An ``InputError`` naming the command-line ``option`` unless ``path`` can be written as a file:
    not a directory, its folder creatable and writable (checked by writing a probe file there)."""
    path = Path(path)
    if path.is_dir():
        raise InputError("<command line>", option, f"{path} is a directory; give a file name to write")
    _check_writable_folder(path.parent, option, f"folder of {path}")
    return path


def check_output_dir(path: str | Path, option: str) -> Path:
    """An ``InputError`` naming ``option`` unless ``path`` is (or can be created as) a writable folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError("<command line>", option, f"{path} is an existing file, not a folder")
    _check_writable_folder(path, option, "folder")
    return path


def _check_writable_folder(folder: Path, option: str, what: str) -> None:
    if _virtual(folder):
        raise InputError("<command line>", option, f"{what} {folder} is on a virtual file system (/proc, /sys, /dev); "
                         "give a folder on a disk")
    for parent in [folder, *folder.parents]:
        if parent.exists():
            if not parent.is_dir():
                raise InputError("<command line>", option, f"{parent} is a file, so {folder} cannot be a folder")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".weave-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError("<command line>", option, f"cannot write in {what} {folder}: {describe_os_error(exc)}") from None
