"""The cost profile calibrated against step timings (hvd_agents.policy.calibration)."""

from __future__ import annotations

import pytest

from hvd_agents.policy import CostModel
from hvd_agents.policy.calibration import OUTLIER, PLAIN_EMA, StepCalibration


def test_scaled_cost_model_scales_only_the_extra_cost() -> None:
    profile = CostModel(((0, 1.0), (1, 1.3), (8, 1.8)))
    scaled = profile.scaled(0.5)
    assert scaled.verify(0) == 1.0
    assert scaled.verify(1) == pytest.approx(1.15)
    assert scaled.verify(8) == pytest.approx(1.4)
    assert profile.scaled(1.0).points == profile.points
    with pytest.raises(ValueError, match="cost scale must be >= 0"):
        profile.scaled(-0.1)


def test_docstring_example_alpha_moves_to_what_the_engine_pays() -> None:
    # plain steps 60 ms, one-token drafts 67.2 ms where the profile says p(1) = 1.3: alpha = 0.12 / 0.3 = 0.4
    calibration = StepCalibration()
    for _ in range(5):
        calibration.observe(0.067, 0.3)  # no plain step yet: cannot tell the fixed part from the draft's
    assert calibration.alpha == 1.0 and calibration.steps == 0
    assert calibration.step_s == pytest.approx(0.067 / 1.3)  # drafted steps stand in for T0 meanwhile
    for _ in range(300):
        calibration.observe(0.060, 0.0)
        calibration.observe(0.0672, 0.3)
    assert calibration.plain_s == pytest.approx(0.060)
    assert calibration.step_s == pytest.approx(0.060)
    assert calibration.alpha == pytest.approx(0.4, abs=0.01)


def test_alpha_follows_a_draft_cost_above_the_profile_too() -> None:
    calibration = StepCalibration()
    for _ in range(300):
        calibration.observe(0.050, 0.0)
        calibration.observe(0.050 * 1.6, 0.4)  # the engine pays 0.6 where the profile says 0.4
    assert calibration.alpha == pytest.approx(1.5, abs=0.02)


def test_one_disturbed_step_moves_the_calibration_little() -> None:
    calibration = StepCalibration()
    for _ in range(300):
        calibration.observe(0.060, 0.0)
        calibration.observe(0.0672, 0.3)
    alpha, plain = calibration.alpha, calibration.plain_s
    calibration.observe(6.0, 0.3)  # a step 100 times too long (another process, a page fault)
    assert calibration.alpha - alpha < 0.1
    calibration.observe(6.0, 0.0)
    assert calibration.plain_s <= plain + PLAIN_EMA * (OUTLIER - 1.0) * plain + 1e-12
