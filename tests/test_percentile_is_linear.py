"""The one percentile definition: linear interpolation between closest ranks (numpy's default)."""

import random

import pytest

from ray_geolb.percentile import percentile


def test_interpolates_between_ranks_not_nearest_rank():
    # nearest-rank would answer 2 (or 3) for the median of four values and 10 or 20 for p25 of [10, 20]
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([10, 20], 25) == 12.5
    # rank (n - 1) * q / 100: p90 of 0..10 sits exactly on 9, p95 halfway between 9 and 10
    xs = list(range(11))
    assert percentile(xs, 90) == 9.0
    assert percentile(xs, 95) == 9.5
    assert percentile(xs, 0) == 0.0 and percentile(xs, 100) == 10.0


def test_sequence_of_percentiles_and_empty_input():
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], (50, 75, 99)) == [3.0, 4.0, pytest.approx(4.96)]
    assert percentile([7.5], (1, 50, 99)) == [7.5, 7.5, 7.5]
    assert percentile([], 50) is None
    assert percentile([], (50, 99)) == [None, None]
    assert isinstance(percentile([1, 2], 50), float)


def test_matches_the_textbook_linear_formula():
    rng = random.Random(3)
    for _ in range(200):
        xs = [rng.expovariate(1.0) for _ in range(rng.randint(1, 300))]
        s = sorted(xs)
        for q in (50, 90, 99):
            k = (len(s) - 1) * q / 100
            f = int(k)
            c = min(f + 1, len(s) - 1)
            assert percentile(xs, q) == pytest.approx(s[f] + (s[c] - s[f]) * (k - f), rel=1e-12, abs=1e-15)
