"""Synthetic training tokens with something to learn.

Uniformly random tokens would make a useless check: nothing can be learned from them, so a model's loss only
falls from its initial value to ln(vocab) however the node computes. These sequences come from a seeded random
Markov chain instead: tokens live in the first ACTIVE_TOKENS ids, and each token is followed by one of
SUCCESSORS tokens fixed for it. A model that trains correctly drives the loss from about ln(vocab) towards
ln(SUCCESSORS); a node that computes garbage does not.
"""

from __future__ import annotations

import torch
from torch import Tensor

ACTIVE_TOKENS = 128
SUCCESSORS = 4


class SyntheticTokens:
    """Batch `step` of the run is the same on every rank and in every layout: generated on the CPU from
    (seed, step), whatever device trains on it."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int) -> None:
        self.seq_len = seq_len
        self.seed = seed
        self.active = min(vocab_size, ACTIVE_TOKENS)
        generator = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(self.active, (self.active, SUCCESSORS), generator=generator)

    def batch(self, step: int, n_sequences: int) -> Tensor:
        """(n_sequences, seq_len + 1) token ids: inputs are [:, :-1], labels [:, 1:]."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 1)
        tokens = torch.empty(n_sequences, self.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.active, (n_sequences,), generator=generator)
        picks = torch.randint(SUCCESSORS, (n_sequences, self.seq_len), generator=generator)
        for t in range(self.seq_len):
            tokens[:, t + 1] = self.successors[tokens[:, t], picks[:, t]]
        return tokens
