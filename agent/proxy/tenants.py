"""Per-tenant attribution with bounded cardinality: a hashed header value, the top N by name, the rest `other`.

The header's value is never exported (it may be an API key): its label is the first 12 hex digits of a
BLAKE2b hash. Counting is Space-Saving over a bounded table (8 x N keys), so memory stays bounded however
many tenants there are; the named set is the top N by count, refreshed at each snapshot, and until it is
full a new tenant is named at once. A tenant that drops out of the top N is counted as `other` from then
on; its old series stop growing and are dropped once more than 2 x N + 2 tenant labels have series
(stats.py). `none` is a request without the header (or with no header configured).
"""

from __future__ import annotations

import hashlib

OTHER = "other"
NONE = "none"


def tenant_key(value: str | None) -> str | None:
    """The hashed key of a header value; None for an absent or empty header."""
    if value is None or not value.strip():
        return None
    return hashlib.blake2b(value.strip().encode("utf-8", "replace"), digest_size=6).hexdigest()


class TenantTop:
    """Counts tenant keys in a bounded table and names the top N."""

    def __init__(self, top: int, capacity: int | None = None) -> None:
        self.top = max(0, top)
        self.capacity = max(self.top, capacity if capacity is not None else 8 * self.top)
        self._counts: dict[str, int] = {}
        self._order: dict[str, int] = {}  # first-seen order, the tie-breaker
        self._seen = 0
        self._named: set[str] = set()

    def label(self, key: str | None) -> str:
        """Count one request of this tenant and return its label value."""
        if key is None:
            return NONE
        if self.top == 0:
            return OTHER
        self._count(key)
        if key not in self._named and len(self._named) < self.top:
            self._named.add(key)
        return key if key in self._named else OTHER

    def refresh(self) -> frozenset[str]:
        """Re-rank: the N most counted keys become the named set."""
        ranked = sorted(self._counts, key=lambda k: (-self._counts[k], self._order[k]))
        self._named = set(ranked[: self.top])
        return frozenset(self._named)

    def _count(self, key: str) -> None:
        if key in self._counts:
            self._counts[key] += 1
            return
        if len(self._counts) >= self.capacity:
            # Space-Saving: the newcomer inherits the smallest count, so a heavy hitter always climbs in.
            victim = min(self._counts, key=lambda k: (self._counts[k], -self._order[k]))
            floor = self._counts.pop(victim)
            del self._order[victim]
            self._named.discard(victim)
        else:
            floor = 0
        self._seen += 1
        self._order[key] = self._seen
        self._counts[key] = floor + 1
