"""Verdicts over seeds (ray_geolb.sim.verdict): met only beyond the seed-to-seed standard error."""

from __future__ import annotations

import math

import pytest

from ray_geolb.sim.verdict import degenerate, goal, paired_ratios, paper_ratio, seed_stats


def test_seed_stats_standard_error():
    st = seed_stats([1.0, 2.0, 3.0, 4.0, None])
    assert st["n"] == 4 and st["mean"] == 2.5
    assert st["sd"] == pytest.approx(math.sqrt(5 / 3)) and st["se"] == pytest.approx(math.sqrt(5 / 3) / 2)


@pytest.mark.parametrize("values,verdict", [
    ([1.02, 1.03, 1.01, 1.02], "met"),  # mean 1.02, se 0.004
    ([0.95, 1.10, 0.98, 1.05], "within noise"),  # mean 1.02, se 0.034: straddles 1.0 per seed
    ([0.97, 0.98, 0.96, 0.97], "not met"),
    ([1.2, 1.3, 1.25], "too few seeds (3 < 4)"),
    ([1.0, 1.0, 1.0, 1.0], "within noise"),  # a tie is not "met"
])
def test_goal_needs_four_seeds_and_a_margin_beyond_noise(values, verdict):
    assert goal(values, 1.0)["verdict"] == verdict


@pytest.mark.parametrize("values,paper,verdict", [
    ([1.25, 1.30, 1.28, 1.26], 1.27, "reproduced"),
    ([2.4, 2.5, 2.6, 2.45], 1.4, "direction reproduced, effect 3.7x the paper's: overshoot (flagged)"),
    ([1.05, 1.06, 1.04, 1.05], 1.27, "direction only (effect 0.19x the paper's)"),
    ([0.90, 0.92, 0.91, 0.93], 1.27, "opposite direction"),
    ([0.97, 1.04, 0.99, 1.01], 1.27, "no effect beyond noise"),
])
def test_paper_ratio_flags_overshoot_and_weak_effects(values, paper, verdict):
    assert paper_ratio(values, paper)["verdict"] == verdict


def test_paper_range_judges_the_effect_against_both_ends():
    within = [1.15, 1.16, 1.14, 1.15]
    assert paper_ratio(within, 1.07, 1.18)["verdict"] == "reproduced"  # 2.1x the low end's effect: in range
    assert paper_ratio(within, 1.07)["verdict"].endswith("overshoot (flagged)")
    assert paper_ratio([3.1, 3.0, 3.2, 3.1], 1.12, 2.06)["verdict"] == "reproduced"  # 1.98x the high end
    assert paper_ratio([3.3, 3.2, 3.4, 3.3], 1.12, 2.06)["verdict"].endswith("overshoot (flagged)")


def test_paired_ratios_and_degenerate_groups():
    assert paired_ratios({0: 2.0, 1: 3.0, 2: 1.0}, {0: 1.0, 1: 0.0, 3: 1.0}) == {0: 2.0, 1: None}
    assert degenerate({"us": 1}) == "one replica in total"
    assert degenerate({"us-west": 1, "germany": 1, "israel": 1}) == "one replica per region"
    assert degenerate({"us": 2, "eu": 1}) is None
