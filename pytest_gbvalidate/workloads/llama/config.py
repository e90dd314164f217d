"""Llama 3 model shapes. Pure Python: the baseline loader validates layouts against these without torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaConfig:
    name: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int  # SwiGLU hidden size
    vocab_size: int
    seq_len: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise ValueError(f"{self.name}: dim {self.dim} must split into {self.n_heads} heads of even size")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: {self.n_heads} heads do not share {self.n_kv_heads} KV heads evenly")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


# Meta Llama 3 8B (as published with the weights): about 8.03 B parameters.
LLAMA3_8B = LlamaConfig(
    name="llama3_8b", n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256, seq_len=8192
)

# The same architecture at a size a 2-core CPU trains in seconds: 4 layers (PP=2 puts 2 on each stage),
# heads and KV heads divisible by 2 (TP=2), GQA with 2 query heads per KV head as in the 8B model.
LLAMA3_TINY = LlamaConfig(
    name="llama3_tiny", n_layers=4, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=192, vocab_size=512, seq_len=64
)

CONFIGS: dict[str, LlamaConfig] = {c.name: c for c in (LLAMA3_8B, LLAMA3_TINY)}
