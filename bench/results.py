"""The figures a bench run produces: named values with units, grouped by scenario.

Figures are printed, never asserted. Latency samples are kept for the chart.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Figure:
    """One measured value, with its unit; `value` None means not measured (see note)."""

    scenario: str
    name: str
    value: float | int | str | None
    unit: str
    note: str = ""


@dataclass
class Results:
    """Everything a bench run measured, plus the context needed to read it."""

    meta: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    # Label → latency samples in ms (for the chart).
    latency_samples: dict[str, list[float]] = field(default_factory=dict)
    # Label → runs per second (for the chart).
    throughput: dict[str, float] = field(default_factory=dict)
    # The headline figures, under the stable keys of `report.TARGETS` (None: not measured).
    headline: dict[str, float | None] = field(default_factory=dict)

    def add(
        self,
        scenario: str,
        name: str,
        value: float | int | str | None,
        unit: str,
        note: str = "",
    ) -> None:
        self.figures.append(Figure(scenario, name, value, unit, note))

    def add_percentiles(
        self, scenario: str, name: str, samples_ms: list[float], note: str = ""
    ) -> dict[str, float | None]:
        """p50, p95 and p99 of a latency distribution, in ms."""
        found = percentiles(samples_ms)
        for label, value in found.items():
            self.add(scenario, f"{name} {label}", value, "ms", note)
        return found

    def value(self, scenario: str, name: str) -> float | None:
        for fig in self.figures:
            if fig.scenario == scenario and fig.name == name and isinstance(fig.value, int | float):
                return float(fig.value)
        return None

    def as_json(self) -> dict[str, Any]:
        return {
            **self.headline,
            "meta": self.meta,
            "figures": [asdict(f) for f in self.figures],
            "throughput_runs_per_s": self.throughput,
            "latency_summary_ms": {k: percentiles(v) for k, v in self.latency_samples.items()},
        }


def percentiles(samples: list[float]) -> dict[str, float | None]:
    """Nearest-rank p50, p95 and p99; None for an empty sample."""
    if not samples:
        return {"p50": None, "p95": None, "p99": None}
    ordered = sorted(samples)

    def rank(p: float) -> float:
        index = max(0, math.ceil(p / 100 * len(ordered)) - 1)
        return round(ordered[index], 2)

    return {"p50": rank(50), "p95": rank(95), "p99": rank(99)}
