"""Exact test: can some schedule give every pod on one GPU its guaranteed time?

A schedule runs, at each instant, a set of pods whose SM partitions sum to <= 100 %; pods
may be preempted and resumed. The pods are servable in one window iff the least total time
of such a schedule is <= 1. That minimum is a linear program over *configurations* (sets of
pods that fit side by side), the fractional bin-packing LP, solved here by column generation
with an exact 0/1-knapsack pricing step over the integer SM percents.

Used only to judge the original FaST-GShare admission rule in the benchmark.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog

from fastgshare import keys
from fastgshare.share import ShareSpec

EPSILON = 1e-9


def minimum_window(shares: list[ShareSpec]) -> float:
    """The least fraction of the window in which every pod gets its guaranteed time."""
    items = [(s.request_permille / keys.TIME_UNITS, s.sm_percent) for s in shares if not s.is_best_effort]
    if not items:
        return 0.0
    demand = np.array([request for request, _ in items])
    columns: list[tuple[int, ...]] = [(i,) for i in range(len(items))]
    while True:
        matrix = np.zeros((len(items), len(columns)))
        for j, column in enumerate(columns):
            matrix[list(column), j] = 1.0
        result = linprog(np.ones(len(columns)), A_ub=-matrix, b_ub=-demand, bounds=(0, None), method="highs")
        if result.status != 0:
            raise RuntimeError(f"LP failed: {result.message}")
        duals = -result.ineqlin.marginals
        value, best = _best_configuration(duals, [sm for _, sm in items])
        if value <= 1 + EPSILON or best in columns:
            return float(result.fun)
        columns.append(best)


def servable(shares: list[ShareSpec]) -> bool:
    return minimum_window(shares) <= 1 + 1e-6


def _best_configuration(values: np.ndarray, sms: list[int]) -> tuple[float, tuple[int, ...]]:
    """0/1 knapsack: the set of pods with SM sum <= 100 of the highest total dual value."""
    capacity = keys.SM_UNITS
    best = [0.0] * (capacity + 1)
    chosen: list[tuple[int, ...]] = [()] * (capacity + 1)
    for i, sm in enumerate(sms):
        if values[i] <= 0:
            continue
        for room in range(capacity, sm - 1, -1):
            candidate = best[room - sm] + values[i]
            if candidate > best[room] + EPSILON:
                best[room], chosen[room] = candidate, (*chosen[room - sm], i)
    top = max(range(capacity + 1), key=lambda room: best[room])
    return best[top], tuple(sorted(chosen[top]))
