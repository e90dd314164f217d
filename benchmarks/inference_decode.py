"""The inference check's decoding replayed as a CUDA graph against the same step launched op by op, side by side in
one run on the device present (CUDA if there is one, else the CPU, where both are the same code): prefill and
decode tokens/s, peak memory, and whether both chose the same tokens.

    python benchmarks/inference_decode.py [--model llama3_8b] [--batch 8] [--prompt-len 1024] [--new-tokens 128]

The defaults are the inference check's on a GPU (suites/test_inference.py); on the CPU the tiny model's.
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

from pytest_gbvalidate.workloads.llama import generate
from pytest_gbvalidate.workloads.llama.config import CONFIGS
from pytest_gbvalidate.workloads.llama.generate import DTYPES, Generation
from pytest_gbvalidate.workloads.llama.model import Transformer


def run(model: Transformer, prompts: torch.Tensor, new_tokens: int, graphed: bool) -> tuple[Generation, float | None]:
    """One warm-up generation of two tokens, then the timed one; (it, the peak GiB on a GPU)."""
    # Op by op: the step itself in place of its replay (generate._replayed returns the step off CUDA).
    with mock.patch.object(generate, "_replayed", generate._replayed if graphed else lambda step, *_, **__: step):
        generate.generate(model, prompts, 2)
        if prompts.device.type != "cpu":
            torch.accelerator.reset_peak_memory_stats(prompts.device)
        result = generate.generate(model, prompts, new_tokens)
    peak = None if prompts.device.type == "cpu" else torch.accelerator.max_memory_allocated(prompts.device) / 2**30
    return result, peak


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", choices=sorted(CONFIGS))
    parser.add_argument("--batch", type=int)
    parser.add_argument("--prompt-len", type=int)
    parser.add_argument("--new-tokens", type=int)
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    cfg = CONFIGS[args.model or ("llama3_8b" if gpu else "llama3_tiny")]
    batch = args.batch or (8 if gpu else 4)
    prompt_len = args.prompt_len or (1024 if gpu else 32)
    new_tokens = args.new_tokens or (128 if gpu else 32)
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to(DTYPES["bf16"]).materialize(device, seed=0)
    model.eval()
    prompts = torch.randint(cfg.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(0))
    prompts = prompts.to(device)
    name = torch.cuda.get_device_name(device) if gpu else "CPU"
    work = f"batch {batch}, prompt {prompt_len}, {new_tokens} new tokens"
    print(f"{cfg.name} bf16, {work}, on {name}, torch {torch.__version__}")
    print(f"  {'decode':<12} {'prefill tok/s':>14} {'decode tok/s':>13} {'step ms':>8} {'peak GiB':>9}")
    chosen = {}
    for label, graphed in (("op by op", False), ("CUDA graph", True)):
        result, peak = run(model, prompts, new_tokens, graphed)
        chosen[label] = result.tokens
        steps = new_tokens - 1
        print(
            f"  {label:<12} {batch * prompt_len / result.prefill_s:14,.0f} {batch * steps / result.decode_s:13,.0f} "
            f"{result.decode_s / steps * 1e3:8.2f} {'-' if peak is None else f'{peak:.2f}':>9}"
        )
    same = torch.equal(chosen["op by op"], chosen["CUDA graph"])
    print(
        f"  the same tokens chosen both ways: {same}" + ("" if gpu else " (the CPU has no graph: the same code twice)")
    )


if __name__ == "__main__":
    main()
