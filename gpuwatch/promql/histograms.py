"""histogram_quantile over classic histograms (`_bucket` series with an `le` label), as
Prometheus 3 computes it (promql/quantile.go): buckets sorted and merged by bound, counts
forced monotonic, linear interpolation inside the bucket that holds the rank."""

from __future__ import annotations

import bisect
import math

from gpuwatch.promql.values import (
    Labels,
    Vector,
    VSample,
    almost_equal,
    drop_name,
    label_value,
    with_label,
)

# Differences this small between neighbouring cumulative counts are float rounding, not a
# decrease: Prometheus ignores them in either direction (smallDeltaTolerance).
SMALL_DELTA = 1e-12


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """The q-quantile of (upper bound, cumulative count) buckets."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets, key=lambda b: b[0])
    if not buckets or not math.isinf(buckets[-1][0]):
        return math.nan
    merged: list[list[float]] = []
    for bound, count in buckets:  # the same bound twice: one bucket, counts summed
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    if len(merged) < 2:
        return math.nan
    previous = merged[0][1]
    for bucket in merged[1:]:
        current = bucket[1]
        if current == previous:
            continue
        if almost_equal(previous, current, SMALL_DELTA) or current < previous:
            bucket[1] = previous  # a rounding wobble or a decrease: held at the last count
            continue
        previous = current
    observations = merged[-1][1]
    if observations == 0 or math.isnan(observations):
        return math.nan
    rank = q * observations
    counts = [b[1] for b in merged[:-1]]
    b = bisect.bisect_left(counts, rank)  # the first bucket holding the rank
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def histogram_quantile(q: float, vector: Vector, t: float) -> Vector:
    """Per histogram (the labels but `le`, the name included), the q-quantile of its buckets,
    the name dropped from the answer: two histograms of different names and equal labels give
    two answers with one label set, which the evaluator refuses, as Prometheus does. A series
    without a numeric `le` is not a bucket and is left out."""
    histograms: dict[Labels, list[tuple[float, float]]] = {}
    for s in vector:
        le = label_value(s.metric, "le")
        if "_" in le or le != le.strip():  # Python reads "1_0" and " 1"; Go does not
            continue
        try:
            bound = float(le)
        except ValueError:
            continue
        key = with_label(s.metric, "le", "")
        histograms.setdefault(key, []).append((bound, s.value))
    return [VSample(drop_name(key), bucket_quantile(q, b), t) for key, b in histograms.items()]
