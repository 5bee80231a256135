"""Read samples out of a Prometheus exposition (the text /metrics returns), as Prometheus would."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Scrape:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return cls(samples)

    def value(self, name: str, **labels: str) -> float:
        """The sum over every series of `name` whose labels include `labels` (0 if none)."""
        wanted = set(labels.items())
        return sum(v for (n, series), v in self.samples.items() if n == name and wanted <= series)

    def has(self, name: str) -> bool:
        return any(n == name for n, _ in self.samples)

    def names(self) -> set[str]:
        return {n for n, _ in self.samples}


def delta(after: Scrape, before: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def histogram_quantile(quantile: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' estimate from cumulative (upper bound, count) buckets; None without samples."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = quantile * buckets[-1][1]
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return previous_bound
            if count == previous_count:
                return bound
            return previous_bound + (bound - previous_bound) * (rank - previous_count) / (
                count - previous_count
            )
        previous_bound, previous_count = bound, count
    return previous_bound


def beyond_last_bound(quantile: float, buckets: list[tuple[float, float]]) -> bool:
    """Whether the quantile falls in the +Inf bucket, where histogram_quantile can only answer the
    last finite bound: the quantile is that much or more."""
    buckets = sorted(buckets)
    finite = [count for bound, count in buckets if bound != float("inf")]
    return bool(buckets) and buckets[-1][1] > 0 and (not finite or finite[-1] < quantile * buckets[-1][1])


def bucket_deltas(after: Scrape, before: Scrape, name: str, **only: str) -> list[tuple[float, float]]:
    """Cumulative bucket counts of histogram `name` gained between two scrapes, summed over the
    series whose labels include `only`."""
    totals: dict[float, float] = {}
    for (sample_name, labels), value in after.samples.items():
        if sample_name != f"{name}_bucket":
            continue
        named = dict(labels)
        if any(named.get(label) != wanted for label, wanted in only.items()):
            continue
        bound = float(named["le"])
        previous = before.samples.get((sample_name, labels), 0.0)
        totals[bound] = totals.get(bound, 0.0) + value - previous
    return sorted(totals.items())
