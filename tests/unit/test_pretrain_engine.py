"""benchmarks/pretrain_engine.py in its CPU mode on the tiny model: every case it prints trains the same model to
the same loss (fp32), so the table compares speed, not different work. Nothing compiles (`--eager`): the engine's
compiled-equals-eager test covers compilation."""

from __future__ import annotations

import re

import pytest

from tests.helpers.scripts import script

pytestmark = pytest.mark.torch_version  # the built-in engine: pipelining, DTensor, compile


def test_the_benchmark_prints_each_case_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    module = script("pretrain_engine")
    cases = [
        "plain",
        "off",
        "fused-adamw",
        "chunked-loss",
        "all-selective-ac",
        "all-grad-fusion",
        "all-one-pass-loss",
        "all-fp8",
    ]
    module.main(
        [
            "--shape",
            "tiny",
            "--steps",
            "1+10",
            "--cases",
            ",".join([*cases, "compile"]),
            "--peak-tflops",
            # The tiny model runs at a few GFLOPS here: a peak this low keeps its MFU well above the printed 0.1%
            # resolution on a busy machine too (with 1 TFLOPS it printed 0.0% under load).
            "0.01",
            "--eager",
            "--profile",
            "off",
        ]
    )
    out, err = capsys.readouterr()
    assert out.startswith("llama3_tiny (4 layers, dim 64, vocab 512, seq 64), MBS 2, GBS 4, fp32, on CPU")
    rows = {
        m[0]: m[1:]
        # case, first step (s), step (ms), tokens/s, MFU, ..., loss, against the plain loop
        for m in re.findall(r"^  (\S+) +([\d.]+)s +([\d.]+)ms +(\d+) +([\d.]+)% .* ([\d.]+) +([+-][\d.]+)%$", out, re.M)
    }
    assert list(rows) == cases, out
    losses = {case: float(row[4]) for case, row in rows.items()}
    for case in cases[1:-1]:
        assert losses[case] == pytest.approx(losses["plain"], rel=1e-4), out
    assert losses["all-fp8"] == pytest.approx(losses["plain"], rel=0.02), out
    assert all(float(row[1]) > 0 and float(row[3]) > 0 for row in rows.values())
    # One step more of the case asked for, under torch's profiler: the operators that took the most time, the
    # largest first, each with its share of the step.
    assert "all-grad-fusion: weight gradients added into .grad in place after each GEMM\n" in err
    profiled = err.split("off, one step profiled:\n")[1].splitlines()
    assert re.fullmatch(r"  CPU time in the step: [\d.]+ ms", profiled[0]), err
    shares = [re.fullmatch(r" +([\d.]+) ms +([\d.]+)%  \S.*", line) for line in profiled[1:4]]
    assert all(shares), err
    assert [float(m[1]) for m in shares if m] == sorted((float(m[1]) for m in shares if m), reverse=True), err
    # then the matmuls by shape: the tiny model's (tokens, dim) by (dim, dim) projections among them, with a rate
    matmuls = profiled[profiled.index("  matmuls by shape (an operator's own kernels; under torch.compile too):") + 1 :]
    assert any(
        re.fullmatch(r" +[\d.]+ ms +\d+ calls +[\d.e+-]+ TFLOPS  aten::mm \[128, 64\] x \[64, 64\]", x) for x in matmuls
    )


def test_the_benchmark_profiles_only_engine_cases(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        script("pretrain_engine").main(["--shape", "tiny", "--cases", "off", "--profile", "plain,bogus", "--eager"])
    assert raised.value.code == 2
    assert "--profile takes engine cases, not bogus, plain; engine cases: off, " in capsys.readouterr().err


def test_the_benchmark_takes_a_shape_with_more_or_fewer_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    module = script("pretrain_engine")
    module.main(["--shape", "tiny", "--layers", "2", "--cases", "off", "--eager", "--steps", "1+10"])
    out = capsys.readouterr().out
    assert out.startswith("llama3_tiny (2 layers, dim 64, vocab 512, seq 64), MBS 2, GBS 4, fp32, on CPU"), out
    with pytest.raises(SystemExit) as raised:
        module.main(["--shape", "tiny", "--layers", "0", "--cases", "off", "--eager"])
    assert raised.value.code == 2
    assert "--layers takes a positive number of blocks, not 0" in capsys.readouterr().err
