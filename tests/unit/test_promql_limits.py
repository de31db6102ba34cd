"""limitk, limit_ratio and sort_by_label: which series they keep and in what order, as
Prometheus 3 decides (engine.go's aggregationK and HashRatioSampler, functions.go's
funcSortByLabel with facette/natsort)."""

from __future__ import annotations

import promql_parser as pp

from gpuwatch.promql.evaluator import Evaluator
from gpuwatch.promql.memory import MemoryStorage
from gpuwatch.promql.ordering import natural_less
from gpuwatch.promql.values import VSample
from gpuwatch.promql.xxhash import labels_hash, xxh64


def test_xxh64_matches_the_reference_vectors() -> None:
    # from the xxHash specification's test vectors and python-xxhash's documentation
    assert xxh64(b"") == 0xEF46DB3751D8E999
    assert xxh64(b"a") == 0xD24EC4F1A98C6E5B
    assert xxh64(b"abc") == 0x44BC2CF5AD770999
    assert xxh64(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1


def test_a_label_set_hashes_as_name_ff_value_ff() -> None:
    assert labels_hash((("a", "1"), ("b", "2"))) == xxh64(b"a\xff1\xffb\xff2\xff")


def test_natural_order_compares_digit_runs_as_numbers() -> None:
    assert natural_less("gpu2", "gpu10")
    assert not natural_less("gpu10", "gpu2")
    assert natural_less("a", "b")
    assert natural_less("x9y", "x9z")
    assert not natural_less("", "a")  # natsort's quirk: an empty value is never less


def evaluate(expr: str) -> list[str]:
    store = MemoryStorage()
    for i, (gpu, node) in enumerate((("10", "b"), ("2", "a"), ("1", "b"), ("3", "a"))):
        store.series((("__name__", "x"), ("gpu", gpu), ("node", node))).add(0.0, float(i))
    result = Evaluator(store).eval(pp.parse(expr), 10.0)
    assert isinstance(result, list)
    return [
        f"{dict(s.metric)['node']}{dict(s.metric)['gpu']}" for s in result if isinstance(s, VSample)
    ]


def test_limitk_keeps_the_first_series_of_each_group_in_label_order() -> None:
    assert evaluate("limitk(2, x)") == ["b1", "b10"]  # labels sort by gpu before node
    assert evaluate("limitk by (node) (1, x)") == ["b1", "a2"]
    assert evaluate("limitk(0, x)") == []


def test_limit_ratio_and_its_complement_partition_the_series() -> None:
    kept, rest = set(evaluate("limit_ratio(0.5, x)")), set(evaluate("limit_ratio(-0.5, x)"))
    assert kept | rest == {"a2", "a3", "b1", "b10"} and not kept & rest
    assert evaluate("limit_ratio(0, x)") == []


def test_sort_by_label_orders_naturally_then_by_all_labels() -> None:
    assert evaluate('sort_by_label(x, "gpu")') == ["b1", "a2", "a3", "b10"]
    assert evaluate('sort_by_label_desc(x, "node", "gpu")') == ["b10", "b1", "a3", "a2"]
