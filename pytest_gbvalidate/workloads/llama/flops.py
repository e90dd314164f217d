"""Model FLOPs and MFU, counted the standard way for decoder-only transformers. Pure Python. Training FLOPs per
token (forward + backward) are 6 * N + 12 * L * D * S, as in the PaLM paper (Chowdhery et al. 2022, appendix B),
torchtitan's `get_num_flop_per_token` and Megatron-LM's model-FLOPs accounting:
- 6 * N: every matmul weight does one multiply-add (2 FLOPs) per token forward and two backward (input and weight
  gradients). N is every parameter but the input embedding (a gather, not a matmul), RMSNorm weights included
  (a negligible 0.0003% of 8B).
- 12 * L * D * S: attention scores (Q K^T) and their weighted sum (P V), 2 * S * D multiply-adds per token per
  layer forward, times 3 with backward. L layers, D model width, S sequence length. Causal masking is not
  subtracted, as in the references.
Recomputation is not counted (model FLOPs, not hardware FLOPs), so MFU compares layouts and engines by useful work.
For Llama 3 8B at S = 8192: N = 7.50e9, 6N = 45.0e9, 12LDS = 12.9e9, about 57.9 GFLOPs per token."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gbvalidate.workloads.llama.config import LlamaConfig


def block_matmul_params(cfg: LlamaConfig) -> int:
    """The matmul weights of one transformer block: attention's wq, wo, wk, wv and SwiGLU's w1, w2, w3."""
    kv_dim = cfg.n_kv_heads * cfg.head_dim
    return 2 * cfg.dim * cfg.dim + 2 * cfg.dim * kv_dim + 3 * cfg.dim * cfg.ffn_dim


def param_count(cfg: LlamaConfig) -> int:
    """All parameters: embedding, per layer (attention, SwiGLU, two RMSNorms), final norm, untied output."""
    per_layer = block_matmul_params(cfg) + 2 * cfg.dim
    return 2 * cfg.vocab_size * cfg.dim + cfg.n_layers * per_layer + cfg.dim


def matmul_param_count(cfg: LlamaConfig) -> int:
    """N of the formula: every parameter but the input embedding table."""
    return param_count(cfg) - cfg.vocab_size * cfg.dim


def train_flops_per_token(cfg: LlamaConfig) -> int:
    """Forward + backward model FLOPs per token at cfg.seq_len: 6 * N + 12 * L * D * S."""
    return 6 * matmul_param_count(cfg) + 12 * cfg.n_layers * cfg.dim * cfg.seq_len


def model_tflops_per_gpu(cfg: LlamaConfig, tokens_per_s_per_gpu: float) -> float:
    return train_flops_per_token(cfg) * tokens_per_s_per_gpu / 1e12


@dataclass(frozen=True)
class Peak:
    """The dense peak per GPU an MFU divides by, and its source: public peaks differ (GB200's dense bf16 is 2,500
    TFLOPS in NVIDIA's datasheet, 2,450 in dgxc-benchmarking)."""

    tflops_per_gpu: float
    source: str

    def describe(self) -> str:
        return f"{self.tflops_per_gpu:g} TFLOPS per GPU ({self.source})"


def mfu_pct(model_tflops: float, peak: Peak) -> float:
    """Model FLOPs utilisation, percent of the dense peak."""
    return 100.0 * model_tflops / peak.tflops_per_gpu
