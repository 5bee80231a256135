"""Calibration's batches: far enough to measure the step's slope in the batch, never beyond what
the engine runs at once."""

import pytest

from llmserve.serving.calibration import calibration_batches


@pytest.mark.parametrize(
    ("engine_sequences", "batches"),
    [(64, (1, 16, 48)), (512, (1, 16, 48)), (32, (1, 16, 32)), (8, (1, 8)), (1, (1,))],
)
def test_calibration_measures_up_to_a_large_batch_but_never_beyond_the_engines_own(
    engine_sequences: int, batches: tuple[int, ...]
) -> None:
    assert calibration_batches(engine_sequences) == batches
