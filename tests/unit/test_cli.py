"""The command line fails fast, in one line, on what it can check before starting an engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmserve.cli import main


def test_serve_with_missing_model_says_how_to_prepare_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--model", str(tmp_path / "absent")]) == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message
    assert "llmserve prepare-model" in message
    assert "make model" in message


def test_serve_with_bad_config_reports_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--set", "engine.max_num_seqs=-3"]) == 2
    assert "engine.max_num_seqs" in capsys.readouterr().err


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "llmserve" in capsys.readouterr().out
