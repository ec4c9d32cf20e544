"""`RowSampling`: one request's output-control state in the worker."""

from __future__ import annotations

import random
from dataclasses import dataclass

import mlx.core as mx

from protocol.messages import SamplingParams
from worker_proc.logits.custom import Processor, RowProcessor

SEED_MOD = 2**64
"""Seeds are taken modulo this: every request seed (int64, negative ones too) keeps its own
noise stream (with 2**62, seeds 2**62 apart drew the same tokens)."""
GREEDY_BELOW = 1e-5
"""Temperatures below this are greedy (as vLLM): dividing logits by them overflows float32."""
BIAS_LIMIT = 100.0
"""logit_bias values are clipped to ±this (OpenAI's range)."""


@dataclass
class RowSampling:
    """One request's parameters, its seed, and how many tokens it has generated.

    generated: output tokens so far (it positions the seeded noise stream, so a retracted
    request that is prefilled again continues the same stream, and it gates min_tokens).
    bias: the logit_bias as a dense float32 [V] row, built once (None without a bias).
    processor: its custom logit processor (None without one).
    """

    params: SamplingParams
    seed: int
    generated: int = 0
    bias: mx.array | None = None
    processor: RowProcessor | None = None

    @classmethod
    def start(
        cls, params: SamplingParams, vocab: int, generated: int = 0, processors: dict[str, Processor] | None = None
    ) -> RowSampling:
        """State for a new request with a vocabulary of `vocab` logits; a missing seed is
        drawn from the OS. Bias ids outside [0, vocab) are dropped (the HTTP process refuses
        them before they get here). processors: the loaded custom processors; raises
        `ValueError` when the request names one that is not loaded."""
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(SEED_MOD)
        bias = None
        entries = [(t, b) for t, b in params.logit_bias.items() if 0 <= t < vocab]
        if entries:
            bias = mx.zeros((vocab,), dtype=mx.float32)
            bias[mx.array([t for t, _ in entries])] = mx.array(
                [max(-BIAS_LIMIT, min(BIAS_LIMIT, b)) for _, b in entries], dtype=mx.float32
            )
        processor = None
        if params.logit_processor:
            processor = RowProcessor.create(params.logit_processor, params.logit_processor_args, processors or {})
        return cls(params, seed % SEED_MOD, generated, bias, processor)

    @property
    def greedy(self) -> bool:
        """True when this row takes the argmax (temperature below `GREEDY_BELOW`)."""
        return self.params.temperature < GREEDY_BELOW

    @property
    def min_tokens_active(self) -> bool:
        """True while min_tokens_ids must stay masked (fewer than min_tokens generated)."""
        return self.generated < self.params.min_tokens and bool(self.params.min_tokens_ids)

    def noise_key(self) -> tuple[int, int]:
        """The (high, low) uint32 words of this step's 64-bit PRNG key,
        ``(seed * 1_000_003 + generated) % SEED_MOD`` (the odd multiplier keeps distinct
        seeds distinct), built without an op."""
        k = (self.seed * 1_000_003 + self.generated) % SEED_MOD
        return k >> 32, k & 0xFFFFFFFF
