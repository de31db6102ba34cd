"""What promtool 2.42 cannot show about histogram_quantile: Prometheus 3 treats neighbouring
cumulative counts that differ by float rounding (relative 1e-12) as equal, in either direction
(promql/quantile.go, ensureMonotonicAndIgnoreSmallDeltas); 2.42 let an upward wobble move
the answer a whole bucket."""

from __future__ import annotations

import math

from gpuwatch.promql.histograms import bucket_quantile


def test_a_rounding_wobble_upward_does_not_move_the_quantile_a_bucket() -> None:
    wobble = 10.000000000000002
    buckets = [(1.0, 5.0), (2.0, 10.0), (3.0, wobble), (math.inf, wobble)]
    assert bucket_quantile(1.0, buckets) == 2.0  # Prometheus 2.42 answered 3


def test_a_real_increase_is_kept() -> None:
    buckets = [(1.0, 5.0), (2.0, 10.0), (3.0, 10.001), (math.inf, 10.001)]
    assert bucket_quantile(1.0, buckets) == 3.0
