"""rules.speed.averages gives what `statistics` gives, on the data the speed rules feed it."""

import random
import statistics

import pytest

from jobwarden.rules.speed import averages


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 51])
def test_the_same_as_statistics(n: int) -> None:
    rng = random.Random(n)
    for _ in range(50):
        values = [rng.uniform(-5.0, 1e4) for _ in range(n)] + [rng.randint(0, 9) for _ in range(n)]
        assert averages.median(values) == statistics.median(values)
        assert averages.median_low(values) == statistics.median_low(values)
        assert averages.fmean(iter(values)) == pytest.approx(statistics.fmean(values), rel=1e-12)


@pytest.mark.parametrize("function", [averages.median, averages.median_low, averages.fmean])
def test_no_average_of_nothing(function: object) -> None:
    with pytest.raises(ValueError):
        function([])  # type: ignore[operator]
