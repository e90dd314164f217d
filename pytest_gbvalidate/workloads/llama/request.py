"""What a pretraining run is asked to do, whatever engine runs it (the built-in one, train.py; NeMo's, nemo.py):
the model, the layout, the steps, and the built-in engine's speed levers. Frozen data, no torch: the NeMo adapter
and the results import it without the built-in engine."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_gbvalidate.workloads.llama.config import LlamaConfig
from pytest_gbvalidate.workloads.llama.parallel import Layout


@dataclass(frozen=True)
class EngineOptions:
    """The engine's speed levers (benchmarks/pretrain_engine.py measures each against the others off)."""

    # torch.compile each transformer block (its recomputation too); the warm-up steps absorb the compilation.
    # Off unless asked for: the suite compiles where the SKU's baseline says so (`pretrain.compile`).
    compile: bool = False
    # torch.compile's backend: Inductor's generated kernels. Dynamo's tracing, guards and recompile accounting
    # are the same whatever the backend; the tests that check those choose "eager", which compiles in seconds.
    compile_backend: str = "inductor"
    chunked_loss: bool = True  # the head and the cross entropy chunk by chunk (loss.py): no whole logits
    fused_adamw: bool = True  # AdamW's single fused kernel rather than its multi-tensor (foreach) ones
    # Each weight gradient added into its fp32 .grad by the backward pass itself, in the GEMM where the device can
    # (grad_accumulation.py); off until measured to pay. Not with TP or PP (train.py says why).
    grad_accumulation_fusion: bool = False
    # The compiled loss's softmax gradient written in one pass (loss.softmax_grad_one_pass); off until measured to
    # pay. Compiled runs only: eager, the loss keeps softmax_grad's in-place steps.
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
