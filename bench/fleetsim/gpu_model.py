"""A model of one rollout GPU and of a weight broadcast: how long things take, nothing else.

Defaults are our own H200 figures (bench/RESULTS.md, 2026-12-01, SmolLM2-135M, compiled decode):
one decode step of up to 512 rows takes 4.54 ms (the step is launch-bound: fewer rows cost the
same, more rows are modelled as proportionally slower); a prefill of 512 x 200 tokens took 156 ms
(~656k prompt tokens/s; each distinct prompt is prefilled once per group).

Response lengths: no per-sample lengths of a real run are stored in this repository; the arithmetic
job's figures are (bench/results/onegpu_profile_2026-12-01.json, two decode arms of the real run,
SmolLM2-135M, 128-token cap): mean 89.7 / 90.4, median 96 / 99, p90 = max = the cap. A normal
clipped at the cap fits those three facts (mean 0.703 and median 0.762 of the cap, >= 10 % at the
cap): `fit_sigma` finds its spread; lengths are then drawn from it as fractions of
`max_new_tokens` (default 428, which puts the mean at ~300 tokens as issue 34 asks).
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field

MEAN_FRACTION = (89.67 + 90.41) / 2 / 128  # the arithmetic job's mean response length / cap
MEDIAN_FRACTION = (96.0 + 99.0) / 2 / 128


def _phi(x: float) -> float:
    return math.exp(-x * x / 2) / math.sqrt(2 * math.pi)


def _cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def clipped_mean(mu: float, sigma: float) -> float:
    """E[min(X, 1)] for X ~ N(mu, sigma): mu less the expected overshoot past the cap."""
    d = (1 - mu) / sigma
    return mu - (sigma * _phi(d) - (1 - mu) * (1 - _cdf(d)))


def fit_sigma(mean: float = MEAN_FRACTION, median: float = MEDIAN_FRACTION) -> float:
    """The spread of a normal (median `median`) clipped at 1 whose mean is `mean` (bisection)."""
    lo, hi = 1e-4, 5.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if clipped_mean(median, mid) > mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass
class LinkModel:
    """A ring broadcast's cost (docs/performance.md): bandwidth term + one pipeline hop per rank."""

    bytes: float = 270e6            # SmolLM2-135M in bf16
    bandwidth_bps: float = 341e9    # NCCL broadcast between two H200s, 1 GB (docs/FACTS.md)
    hop_s: float = 22e-6            # one 512 KB slice over one hop (~12 us at 45 GB/s) + ~10 us latency
    overhead: float = 2.42          # rlfleet's push->applied vs raw NCCL, 0.5B (FACTS, 2026-11-30)

    def broadcast_s(self, world_size: int) -> float:
        return self.overhead * self.bytes / self.bandwidth_bps + max(0, world_size - 1) * self.hop_s


@dataclass
class GpuModel:
    step_s: float = 0.00454         # one decode step, <= rows_per_step rows
    rows_per_step: int = 512
    prefill_tok_s: float = 656_000.0
    max_new_tokens: int = 428
    mean_fraction: float = MEAN_FRACTION
    median_fraction: float = MEDIAN_FRACTION
    slowdown: float = 1.0           # every simulated duration is multiplied by this (see fleet_sim.py)
    link: LinkModel = field(default_factory=LinkModel)

    def __post_init__(self) -> None:
        if isinstance(self.link, dict):
            self.link = LinkModel(**self.link)
        self.sigma = fit_sigma(self.mean_fraction, self.median_fraction)

    def to_dict(self) -> dict:
        return asdict(self)

    def response_length(self, rng: random.Random, cap: int | None = None) -> int:
        cap = cap or self.max_new_tokens
        fraction = rng.gauss(self.median_fraction, self.sigma)
        return max(1, min(cap, round(fraction * cap)))

    def decode_step_s(self, rows: int, factor: float = 1.0) -> float:
        return self.step_s * max(1.0, rows / self.rows_per_step) * self.slowdown * factor

    def prefill_s(self, prompt_tokens: int, factor: float = 1.0) -> float:
        return prompt_tokens / self.prefill_tok_s * self.slowdown * factor

    def broadcast_s(self, world_size: int) -> float:
        return self.link.broadcast_s(world_size) * self.slowdown

    def request_s(self, prompt_tokens: list[int], lengths: list[list[int]],
                  factor: float = 1.0) -> list[float]:
        """When each group of a request is done, from its start: one prefill of the request's distinct
        prompts, then the decode steps until the group's longest row ends (all rows in one batch)."""
        rows = sum(len(g) for g in lengths)
        start = self.prefill_s(sum(prompt_tokens), factor)
        step = self.decode_step_s(rows, factor)
        return [start + max(g) * step for g in lengths]

    def ideal_groups_per_s(self, prompts_per_request: int, n: int, prompt_tokens: float = 40.0,
                           draws: int = 2000, seed: int = 0) -> float:
        """One replica's groups/s when it is never idle: back-to-back requests of `prompts_per_request`
        prompts (the controller's request size), each lasting until its longest row ends."""
        rng = random.Random(seed)
        total = 0.0
        for _ in range(draws):
            lengths = [[self.response_length(rng) for _ in range(n)] for _ in range(prompts_per_request)]
            total += max(self.request_s([int(prompt_tokens)] * prompts_per_request, lengths))
        return prompts_per_request / (total / draws)
