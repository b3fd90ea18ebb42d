"""Adding up GPU time and money by any key (day, instance, GPU model, kind)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from gpulease.core.money import SECONDS_PER_HOUR, format_credits

K = TypeVar("K")


@dataclass
class Sum:
    seconds: int = 0
    gpu_seconds: int = 0
    charged: int = 0
    credited: int = 0
    transactions: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def time(self, seconds: int, gpus: int) -> None:
        self.seconds += seconds
        self.gpu_seconds += seconds * gpus

    def money(self, kind: str, amount: int) -> None:
        self.transactions += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + amount
        if amount < 0:
            self.charged -= amount
        else:
            self.credited += amount

    def usage(self, symbol: str) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "gpu_seconds": self.gpu_seconds,
            "gpu_hours": round(self.gpu_seconds / SECONDS_PER_HOUR, 4),
            "charged_micro": self.charged,
            "charged": format_credits(self.charged, symbol),
            "credited_micro": self.credited,
            "credited": format_credits(self.credited, symbol),
            "by_kind": dict(sorted(self.by_kind.items())),
        }

    def revenue(self, symbol: str) -> dict[str, object]:
        total = sum(self.by_kind.values())
        return {
            "gpu_seconds": self.gpu_seconds,
            "gpu_hours": round(self.gpu_seconds / SECONDS_PER_HOUR, 4),
            "revenue_micro": total,
            "revenue": format_credits(total, symbol),
            "by_kind": dict(sorted(self.by_kind.items())),
        }


def grouped(items: Iterable[tuple[K, Sum]]) -> dict[K, Sum]:
    """Merge (key, sum) pairs by key."""
    out: dict[K, Sum] = {}
    for key, part in items:
        acc = out.setdefault(key, Sum())
        acc.seconds += part.seconds
        acc.gpu_seconds += part.gpu_seconds
        acc.charged += part.charged
        acc.credited += part.credited
        acc.transactions += part.transactions
        for kind, amount in part.by_kind.items():
            acc.by_kind[kind] = acc.by_kind.get(kind, 0) + amount
    return out


def total(items: Iterable[tuple[object, Sum]]) -> Sum:
    return grouped((0, part) for _, part in items).get(0, Sum())
