"""Read samples out of a Prometheus exposition (the text /metrics returns)."""

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
