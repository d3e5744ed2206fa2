"""Which archived kernel to grow next: PUCT over measured kernels, discounted near speed-of-light.

A kernel is worth expanding when it is fast (exploitation), when it has few children yet
(exploration), and when it is still far from the speed-of-light bound (headroom): a kernel at
the bound has nothing left to give, however fast it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Node:
    id: int
    speedup: float  # measured, over the reference; the root (the reference itself) has 1.0
    children: int  # candidates already proposed from it
    headroom: Optional[float] = None  # measured time / SOL time; 1.0 means at the bound


def puct_scores(nodes: Sequence[Node], c: float = 1.0) -> dict[int, float]:
    if not nodes:
        return {}
    logs = [math.log(max(n.speedup, 1e-9)) for n in nodes]
    lo, hi = min(logs), max(logs)
    span = hi - lo or 1.0
    # prior: softmax over log-speedups, so faster lineages get more of the exploration bonus
    m = max(logs)
    weights = [math.exp(3.0 * (x - m)) for x in logs]
    total_w = sum(weights)
    total_n = sum(n.children for n in nodes) + 1
    scores = {}
    for node, x, w in zip(nodes, logs, weights):
        q = (x - lo) / span
        u = c * (w / total_w) * math.sqrt(total_n) / (1 + node.children)
        score = q + u
        if node.headroom is not None:
            # within 10% of the bound the node is nearly spent; scale smoothly above that
            room = max(0.0, 1.0 - 1.0 / max(node.headroom, 1.0))
            score *= min(1.0, room / 0.1) if room < 0.1 else 1.0
        scores[node.id] = score
    return scores


def select(nodes: Sequence[Node], c: float = 1.0) -> Node:
    scores = puct_scores(nodes, c)
    return max(nodes, key=lambda n: (scores[n.id], n.speedup, -n.id))
