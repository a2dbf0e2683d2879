"""median_excluding, the O(1) peer median of the straggler score, against the plain definition."""

from __future__ import annotations

import pytest

from railyard.logic.health.stats import median, median_excluding

ROWS = [
    [1.0, 2.0],
    [1.0, 2.0, 3.0],
    [1.0, 2.0, 3.0, 4.0],
    [0.5, 0.5, 0.5, 0.9, 1.0],
    [0.1, 0.2, 0.2, 0.3, 0.7, 0.8],
]


@pytest.mark.parametrize("values", ROWS)
def test_the_median_without_each_element_is_the_median_of_the_rest(values: list[float]) -> None:
    for i in range(len(values)):
        assert median_excluding(values, i) == median(values[:i] + values[i + 1 :])


def test_one_element_has_no_peers() -> None:
    assert median_excluding([1.0], 0) is None
