import math

import pytest

from radixray.numbers import Ewma, percentile


def test_percentile_interpolates_skips_none_and_names_its_empty_answer():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)
    assert percentile([5.0, None, 1.0], 100) == 5.0
    assert math.isnan(percentile([], 50)) and percentile([None], 50, empty=None) is None


def test_ewma_weighs_each_sample_alpha():
    e = Ewma(0.25)
    assert e.value is None and e.update(8.0) == 8.0  # the first sample is the average
    assert e.update(0.0) == 6.0 and e.update(4.0) == 5.5
    z = Ewma(1 / 64, initial=0.0)
    assert z.update(1.0) == 1 / 64
    with pytest.raises(ValueError, match="alpha"):
        Ewma(0.0)
