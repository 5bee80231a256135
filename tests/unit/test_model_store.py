"""Model preparation is atomic, and a missing or damaged model names the command that fixes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmserve.engine import model_store
from llmserve.engine.model_store import (
    MANIFEST_NAME,
    ModelNotPreparedError,
    check_model_dir,
    prepare_model,
    verify_model_dir,
)


def fake_convert(_: Path, destination: Path) -> None:
    for name in model_store.REQUIRED_FILES:
        (destination / name).write_text(f"contents of {name}")


@pytest.fixture
def fake_conversion(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []

    def convert(gguf: Path, destination: Path) -> None:
        calls.append(destination)
        fake_convert(gguf, destination)

    monkeypatch.setattr(model_store, "_convert_gguf", convert)
    monkeypatch.setattr(model_store, "locate_gguf", lambda: Path("/fake/model.gguf"))
    return calls


def test_prepare_writes_a_verified_directory_once(tmp_path: Path, fake_conversion: list[Path]) -> None:
    output = tmp_path / "model"
    prepared = prepare_model(output)
    assert prepared.path == output
    assert json.loads((output / MANIFEST_NAME).read_text())["files"]["config.json"] > 0
    prepare_model(output)
    assert len(fake_conversion) == 1, "a good directory is reused"
    assert [p.name for p in tmp_path.iterdir()] == ["model"], "no staging directories left behind"


def test_failed_conversion_leaves_nothing_that_looks_prepared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def half_convert(_: Path, destination: Path) -> None:
        (destination / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(model_store, "_convert_gguf", half_convert)
    monkeypatch.setattr(model_store, "locate_gguf", lambda: Path("/fake/model.gguf"))
    with pytest.raises(KeyboardInterrupt):
        prepare_model(tmp_path / "model")
    assert list(tmp_path.iterdir()) == []


def test_damaged_directory_is_rebuilt(tmp_path: Path, fake_conversion: list[Path]) -> None:
    output = tmp_path / "model"
    prepare_model(output)
    (output / "model.safetensors").write_text("truncated")
    prepare_model(output)
    assert len(fake_conversion) == 2
    verify_model_dir(output)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda d: None, "does not exist"),
        (
            lambda d: (
                d.mkdir(),
                (d / "config.json").write_text("{}"),
                (d / "model.safetensors").write_text(""),
            ),
            "has no manifest",
        ),
        (lambda d: (d.mkdir(), (d / MANIFEST_NAME).write_text("{not json")), "corrupt manifest"),
    ],
)
def test_unprepared_directories_name_the_fixing_command(tmp_path: Path, damage, problem: str) -> None:  # type: ignore[no-untyped-def]
    directory = tmp_path / "model"
    damage(directory)
    with pytest.raises(ModelNotPreparedError, match=problem) as raised:
        verify_model_dir(directory)
    assert "llmserve prepare-model" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_truncated_weights_are_detected(tmp_path: Path, fake_conversion: list[Path]) -> None:
    output = tmp_path / "model"
    prepare_model(output)
    (output / "model.safetensors").write_text("x")
    with pytest.raises(ModelNotPreparedError, match=r"truncated or altered model\.safetensors"):
        verify_model_dir(output)


def test_a_plain_hf_directory_without_manifest_is_accepted_for_serving(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    check_model_dir(tmp_path)
