"""Silent data corruption: every rank runs the same seeded computation (a bf16 and an fp32 GEMM, one fp32 forward and
backward pass of the Llama model) twice; the results must be bit-identical across the node's GPUs and passes, and within
a tolerance of the CPU's, which names the GPU that is off when only two disagree. Defective units compute wrong results
without an error (Meta's "Silent Data Corruptions at Scale", Dixit et al., 2021; Google's "Cores that Don't Count",
Hochschild et al., HotOS 2021; SemiAnalysis' ClusterMAX expects such checks): bit-identity catches a flipped low bit
that no tolerance would."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from pytest_gbvalidate.ranks.gang import RankContext
from pytest_gbvalidate.workloads.llama.config import LLAMA3_TINY
from pytest_gbvalidate.workloads.llama.data import SyntheticTokens
from pytest_gbvalidate.workloads.llama.model import build, loss_fn

MODEL = LLAMA3_TINY
SEED = 1234
SAMPLED_ROWS = 16  # rows of each GEMM's output compared with the CPU reference (all rows are hashed)
SEQUENCES = 4  # the model pass's batch
# Largest |result - reference| / max |reference|: bf16 outputs carry 8 bits of mantissa (2**-8 = 0.4%); beyond
# that the GPU and the CPU differ in summation order only.
TOLERANCE = {"gemm_bf16": 2e-2, "gemm_fp32": 1e-4, "model": 1e-3}
COMPUTATIONS = tuple(TOLERANCE)


def gemm_inputs(m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    return torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)


def sampled_rows(m: int) -> torch.Tensor:
    return torch.linspace(0, m - 1, SAMPLED_ROWS).long()


@dataclass(frozen=True)
class Outcome:
    """One pass of one computation on one rank: its results' digest, and the values compared with the CPU's."""

    digest: str
    checked: torch.Tensor


def run_pass(device: torch.device, m: int, n: int, k: int) -> dict[str, Outcome]:
    a32, b32 = gemm_inputs(m, n, k)
    rows = sampled_rows(m)
    outcomes = {}
    for name, dtype in (("gemm_bf16", torch.bfloat16), ("gemm_fp32", torch.float32)):
        out = torch.matmul(a32.to(device, dtype), b32.to(device, dtype))
        outcomes[name] = Outcome(_digest(out), out[rows.to(device)].float().cpu())
    loss, grads = model_pass(device)
    outcomes["model"] = Outcome(_digest(loss, *grads), torch.stack([loss, *(g.norm() for g in grads)]).cpu())
    return outcomes


def model_pass(device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss and every gradient of one fp32 pass, attention by the math kernel (no atomics: the same bits)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = build(MODEL, torch.device("cpu"), SEED).to(device)  # the CPU's weights: a device draws others
    tokens = SyntheticTokens(MODEL.vocab_size, MODEL.seq_len, SEED).batch(0, SEQUENCES).to(device)
    with sdpa_kernel(SDPBackend.MATH):
        loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()  # type: ignore[no-untyped-call]
    return loss.detach(), [p.grad for p in model.parameters() if p.grad is not None]


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().reshape(-1).cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def sdc_on_rank(ctx: RankContext, m: int, n: int, k: int) -> list[dict[str, Outcome]]:
    """Two passes, fp32 matmuls at full precision (no TF32) whatever the process had set."""
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        return [run_pass(ctx.device, m, n, k) for _ in range(2)]
    finally:
        torch.set_float32_matmul_precision(precision)


def cpu_reference(m: int, n: int, k: int) -> dict[str, torch.Tensor]:
    """Each computation's checked values in fp32 on the CPU (bf16 inputs rounded as the GPU sees them)."""
    a32, b32 = gemm_inputs(m, n, k)
    a_rows = a32[sampled_rows(m)]
    bf16 = a_rows.bfloat16().float() @ b32.bfloat16().float()
    loss, grads = model_pass(torch.device("cpu"))
    return {"gemm_bf16": bf16, "gemm_fp32": a_rows @ b32, "model": torch.stack([loss, *(g.norm() for g in grads)])}


def relative_error(got: torch.Tensor, reference: torch.Tensor) -> float:
    return float((got - reference).abs().max() / reference.abs().max())


def problems(labels: list[str], per_rank: list[list[dict[str, Outcome]]], reference: dict[str, Any]) -> list[str]:
    """Every rank off the reference, changing its answer between passes, or disagreeing with the others' bits."""
    found = []
    for label, passes in zip(labels, per_rank, strict=True):
        for name in COMPUTATIONS:
            first, second = passes[0][name], passes[1][name]
            if first.digest != second.digest:
                found.append(f"{label}: {name} gave different bits in two passes ({first.digest}, {second.digest})")
            error, limit = relative_error(first.checked, reference[name]), TOLERANCE[name]
            if not error <= limit:  # NaN too
                found.append(f"{label}: {name} is off the CPU reference by {error:.3g} (relative; tolerance {limit:g})")
    for name in COMPUTATIONS:
        digests = [passes[0][name].digest for passes in per_rank]
        (common, count), *_ = Counter(digests).most_common()
        if count == len(digests):
            continue
        if count > len(digests) / 2:
            found += [
                f"{label}: {name} differs bit for bit from the {count} other ranks, which agree ({digest} vs {common})"
                for label, digest in zip(labels, digests, strict=True)
                if digest != common
            ]
        else:
            answers = ", ".join(f"{label} {digest}" for label, digest in zip(labels, digests, strict=True))
            found.append(f"{name}: no majority among the ranks ({answers})")
    return found
