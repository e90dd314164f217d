"""The built-in engine's memory per rank, estimated before any rank starts, so a layout that cannot fit the GPU
fails at once, not half-way. Pure Python. A rank of pipeline stage s holds, at the peak of a step:
- its stage's parameters (TP splits a block's matmul weights): fp32 weights (4 bytes each, fp8 training too),
  fp32 gradients (4), AdamW's two fp32 moments (8);
- its blocks' activations kept for the backward pass, per microbatch in flight (1F1B runs up to PP - s ahead);
- on the last stage, the logits and their loss: 14 bytes per logit at the peak of the loss's backward pass
  (its fp32 log-softmax output, the fp32 gradient of it and of the logits, and their bf16 copy); with the chunked
  loss, the fp32 gradients of the final hidden state and of the head, the head's bf16 copy, one chunk's logits;
- with recomputation, one block's whole activations (RankMemory.recompute_gib).
A block's bytes per token in bf16 autocast (d model width, kv key-value width, f SwiGLU width) follow the tensors
autograd saves in model.py: both RMSNorms' fp32 input and output (16d); autocast's bf16 copies of the norms' outputs for
q, k, v, gate and up (10d); the fp32 rotary copies of q and k (4d + 4kv); attention's q, repeated k and v, and output
(8d); wo's input (2d); SwiGLU's gate, up, gated and product (8f). Compiled blocks keep 20d + 8f, Inductor saving the
matmuls' and attention's inputs and outputs (the fp32 block input and residual 8d, the norms' bf16 outputs 4d, q,
repeated k and v and attention's output 8d, SwiGLU's four 8f); with fp8 matmuls half that was measured (10d + 4f: their
saved inputs are fp8). Checked against peaks measured on an H100 and an H200 for every lever of the engine
(tests/unit/test_llama_memory.py): within 4%."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gbvalidate.workloads.llama.config import LlamaConfig
from pytest_gbvalidate.workloads.llama.flops import block_matmul_params
from pytest_gbvalidate.workloads.llama.parallel import Layout

GIB = 2**30
# The chunked loss's chunk (loss.py): 4096 tokens x 128,256 logits is 2.1 GB per fp32 copy (a chunk holds about
# two and a bf16 copy); large enough that its matmuls run at full speed.
CHUNK_TOKENS = 4096
WHOLE_LOGITS_BYTES = 14  # per logit, bf16 autocast; 12 in fp32, where the logits need no fp32 copy
CHUNK_LOGIT_BYTES = 10  # per logit of one chunk: fp32 logits, their fp32 softmax gradient, its bf16 copy


@dataclass(frozen=True)
class RankMemory:
    """One pipeline stage's rank (its TP, CP and DP peers hold the same), in GiB."""

    stage: int
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float  # kept for the backward pass
    logits_gib: float  # the head's and the loss's, on the last stage
    recompute_gib: float  # one block's activations while its backward pass recomputes them

    @property
    def total_gib(self) -> float:
        # The loss's backward pass ends before the first block's recomputation starts: one or the other.
        states = self.weights_gib + self.gradients_gib + self.optimizer_gib
        return states + self.activations_gib + max(self.logits_gib, self.recompute_gib)

    def line(self) -> str:
        recompute = f" (or {self.recompute_gib:.3g} recomputed)" if self.recompute_gib else ""
        return (
            f"stage {self.stage}: weights {self.weights_gib:.3g} + gradients {self.gradients_gib:.3g} + optimizer "
            f"{self.optimizer_gib:.3g} + activations {self.activations_gib:.3g} + logits {self.logits_gib:.3g}"
            f"{recompute} = {self.total_gib:.3g} GiB"
        )


def stage_params(cfg: LlamaConfig, layout: Layout, stage: int) -> int:
    """Parameters a rank of pipeline stage `stage` holds (its TP share of each block's matmuls)."""
    per_block = block_matmul_params(cfg) // layout.tp + 2 * cfg.dim  # the two RMSNorm weights are replicated
    params = cfg.n_layers // layout.pp * per_block
    if stage == 0:
        params += cfg.vocab_size * cfg.dim  # embedding
    if stage == layout.pp - 1:
        params += cfg.dim + cfg.vocab_size * cfg.dim  # final norm, head
    return params


def _kept_bytes_per_token(cfg: LlamaConfig, layout: Layout, mode: str, compiled: bool) -> int:
    """What one block keeps for its backward pass, in bytes per token (the module's docstring)."""
    d, kv, f, tp = cfg.dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn_dim, layout.tp
    if mode == "full":
        return 4 * d  # its fp32 input
    if mode == "selective":
        # its input, and the outputs of its matmuls and attention: q, k, v, attention, wo, gate, up, down
        return 4 * d + 4 * d + (4 * d + 4 * kv + 4 * f) // tp
    if layout.precision == "fp32":
        return 16 * d + (24 * d + 4 * kv + 16 * f) // tp  # compiled or not: no compiled fp32 peak was measured
    if compiled and layout.precision == "fp8":
        return 6 * d + (4 * d + 4 * f) // tp
    if compiled:
        return 12 * d + (8 * d + 8 * f) // tp
    return 26 * d + (14 * d + 4 * kv + 8 * f) // tp


def estimate(cfg: LlamaConfig, layout: Layout, *, chunked_loss: bool, compiled: bool) -> list[RankMemory]:
    """Each pipeline stage's rank at its peak; `compiled`: torch.compile'd blocks (EngineOptions.compile)."""
    tokens = layout.mbs * cfg.seq_len // layout.cp  # per microbatch, on this rank
    blocks = cfg.n_layers // layout.pp
    mode = layout.activation_checkpointing
    whole_block = tokens * _kept_bytes_per_token(cfg, layout, "none", compiled)  # recomputed, where it is
    out = []
    for stage in range(layout.pp):
        params = stage_params(cfg, layout, stage)
        in_flight = min(layout.pp - stage, layout.microbatches) if layout.pp > 1 else 1
        logits = 0
        if stage == layout.pp - 1 and chunked_loss:
            chunk = min(CHUNK_TOKENS, tokens)
            head_copy = 0 if layout.precision == "fp32" else 2 * cfg.vocab_size * cfg.dim  # bf16, under autocast
            gradients = 4 * (tokens + cfg.vocab_size) * cfg.dim  # of the final hidden state and of the head, fp32
            logits = gradients + head_copy + CHUNK_LOGIT_BYTES * chunk * cfg.vocab_size
        elif stage == layout.pp - 1:
            logits = (12 if layout.precision == "fp32" else WHOLE_LOGITS_BYTES) * tokens * cfg.vocab_size
        out.append(
            RankMemory(
                stage=stage,
                weights_gib=4 * params / GIB,
                gradients_gib=4 * params / GIB,
                optimizer_gib=8 * params / GIB,
                activations_gib=in_flight * blocks * tokens * _kept_bytes_per_token(cfg, layout, mode, compiled) / GIB,
                logits_gib=logits / GIB,
                recompute_gib=whole_block / GIB if mode != "none" else 0.0,
            )
        )
    return out


def busiest(ranks: list[RankMemory]) -> RankMemory:
    return max(ranks, key=lambda r: r.total_gib)


# Beside the counted tensors a GPU holds the CUDA context (about half a GiB), NCCL's buffers (up to about a GiB on 8
# GPUs, more with NVLS), cuBLAS workspaces, P2P peers' contexts, and the allocator's fragmentation (up to a tenth):
# engineering allowances, not measurements (benchmarks/gpu_smoke.py prints the estimate beside the measured peak).
FIXED_HEADROOM_GIB = 2.0
FRAGMENTATION_FRACTION = 0.1


def usable_gib(gpu_total_gib: float) -> float:
    """The most a rank's tensors may take on a GPU of `gpu_total_gib`: (total - FIXED_HEADROOM_GIB) less
    FRAGMENTATION_FRACTION of it. 80 GiB -> 70.2; 139 GiB -> 123.3."""
    return max(0.0, (gpu_total_gib - FIXED_HEADROOM_GIB) * (1 - FRAGMENTATION_FRACTION))
