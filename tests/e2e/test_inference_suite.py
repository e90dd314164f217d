"""The inference suite end to end, in the session's run of every suite (tests/helpers/cpu_run.py): the cpu SKU's
check reports tokens per second per rank."""

from __future__ import annotations

import pytest

from tests.helpers.cpu_run import CpuRun


@pytest.mark.torch_version  # generation's torch.accelerator calls
def test_the_cpu_inference_check_reports_tokens_per_second_per_rank(cpu_suites_run: CpuRun) -> None:
    # Read from the session's run of every suite.
    assert cpu_suites_run.outcomes("test_inference.py") == {"passed": 1, "skipped": 0, "failed": 0}
    measured = cpu_suites_run.measurements("test_inference.py")
    assert [m["scope"] for m in measured] == ["rank0", "rank1"]  # both ranks generate at once
    for m in measured:
        details = m["details"]
        assert (details["model"], details["batch"], details["new_tokens"], details["precision"]) == (
            "llama3_tiny",
            4,
            32,
            "bf16",
        )
        assert m["value"] == pytest.approx(4 * 32 / (details["prefill_s"] + details["decode_s"]))
        assert m["verdict"] in ("pass", "warn") and details["peak_memory_gib"] is None
        # the best of three generations, each in the details, their spread the figure's noise
        assert len(details["passes"]) in (3, 2) and m["value"] == max(details["passes"])  # 2: measured again
        assert m["noise"]["summary"] == "best_pass" and m["noise"]["count"] == len(details["passes"])
