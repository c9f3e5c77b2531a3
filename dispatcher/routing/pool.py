"""Weighted random sampling with O(log n) updates, for one routing round's choices."""

from __future__ import annotations

import random
from collections.abc import Sequence


class WeightedPool:
    """Weighted random sampling with O(log n) updates (a Fenwick tree of weights)."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.n = n = len(weights)
        self.weights = [float(w) for w in weights]
        self.positive = sum(1 for w in self.weights if w > 0)
        """How many weights are above zero (the agents a choice was made among)."""
        # (Built in O(n): each node adds itself into its parent, as `set` would one by one.)
        tree = [0.0, *self.weights]
        for i in range(1, n + 1):
            parent = i + (i & -i)
            if parent <= n:
                tree[parent] += tree[i]
        self.tree = tree

    def set(self, i: int, weight: float) -> None:
        delta = weight - self.weights[i]
        self.positive += (weight > 0) - (self.weights[i] > 0)
        self.weights[i] = weight
        j = i + 1
        while j <= self.n:
            self.tree[j] += delta
            j += j & -j

    def total(self) -> float:
        s, j = 0.0, self.n
        while j > 0:
            s += self.tree[j]
            j -= j & -j
        return s

    def sample(self, rng: random.Random) -> int | None:
        total = self.total()
        if total <= 1e-9:
            return None
        target = rng.random() * total
        pos, step = 0, 1 << self.n.bit_length()
        while step:
            nxt = pos + step
            if nxt <= self.n and self.tree[nxt] <= target:
                target -= self.tree[nxt]
                pos = nxt
            step >>= 1
        return min(pos, self.n - 1) if self.weights[min(pos, self.n - 1)] > 0 else self._first()

    def _first(self) -> int | None:
        return next((i for i, w in enumerate(self.weights) if w > 0), None)
