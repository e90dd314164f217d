"""What a pretraining run is asked to do, whatever engine runs it (train.py, nemo.py). No torch: the NeMo adapter
and the results import it without the built-in engine."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gbvalidate.workloads.llama.config import LlamaConfig
from pytest_gbvalidate.workloads.llama.parallel import Layout


@dataclass(frozen=True)
class EngineOptions:
    """The engine's speed levers (benchmarks/pretrain_engine.py measures each against the others off)."""

    # torch.compile each transformer block (its recomputation too); the warm-up steps absorb the compilation. Off
    # unless asked for: the suite compiles where the SKU's baseline says so (`pretrain.compile`).
    compile: bool = False
    # Inductor; tests of dynamo's tracing, guards and recompiles, alike whatever the backend, take "eager" (fast).
    compile_backend: str = "inductor"
    chunked_loss: bool = True  # the head and the cross entropy chunk by chunk (loss.py): no whole logits
    fused_adamw: bool = True  # AdamW's single fused kernel rather than its multi-tensor (foreach) ones
    # Weight gradients added into their fp32 .grad by the backward pass (grad_accumulation.py): off until it pays.
    grad_accumulation_fusion: bool = False
    # The compiled loss's softmax gradient in one pass (loss.softmax_grad_one_pass): off until it pays.
    loss_grad_one_pass: bool = False


@dataclass(frozen=True)
class TrainRequest:
    cfg: LlamaConfig
    layout: Layout
    warmup_steps: int
    timed_steps: int
    learning_rate: float
    seed: int = 0
    options: EngineOptions = EngineOptions()

    @property
    def steps(self) -> int:
        return self.warmup_steps + self.timed_steps
