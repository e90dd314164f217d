"""Synthetic training tokens with something to learn (from uniformly random ones the loss only falls to ln(vocab)):
a seeded random Markov chain over the first ACTIVE_TOKENS ids, each followed by one of SUCCESSORS tokens fixed for
it, so correct training drives the loss from about ln(vocab) towards ln(SUCCESSORS); garbage computing does not."""

from __future__ import annotations

import torch
from torch import Tensor

ACTIVE_TOKENS = 128
SUCCESSORS = 4


class SyntheticTokens:
    """Batch `step` is the same on every rank and in every layout: made on the CPU from (seed, step)."""

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
