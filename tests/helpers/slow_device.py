"""A device that runs at a fraction of its speed, for the plugin's tests and the false-alarm benchmark, never a
real run: every timed call of the measurement code (bench/timing.py's time_op_s, as the copies, GEMMs,
collectives, the pairwise all_reduce and the training step call it) is followed by a sleep that stretches it to
1 / speed of its time, inside the timed interval, as a GPU held down by its clocks or a slow link would take
longer. `python -c` with FALSE_ALARMS_SPEED set: see install_from_environment."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from pytest_gbvalidate.bench import collectives, copy, gemm, pairwise, timing
from pytest_gbvalidate.workloads.llama import train

NAME = "time_op_s"


@contextlib.contextmanager
def slowed(speed: float) -> Iterator[None]:
    """While inside, the copies and GEMMs measured in this process run at `speed` (0.75: 25% slower)."""
    if not 0 < speed <= 1:
        raise ValueError(f"speed must be in (0, 1], got {speed}")
    real = timing.time_op_s

    def slow_time_op_s(device: Any, op: Callable[[], object], **kwargs: Any) -> list[float]:
        def slow_op() -> object:
            start = time.perf_counter()
            result = op()
            time.sleep((time.perf_counter() - start) * (1 / speed - 1))
            return result

        return real(device, slow_op, **kwargs)

    modules = (copy, gemm, collectives, pairwise, train)  # each imported time_op_s by name: replaced there
    saved = [getattr(m, NAME) for m in modules]
    for m in modules:
        setattr(m, NAME, slow_time_op_s)
    try:
        yield
    finally:
        for m, fn in zip(modules, saved, strict=True):
            setattr(m, NAME, fn)


def install_from_environment() -> None:
    """Slow this whole process down for good when FALSE_ALARMS_SPEED is set (the benchmark's sitecustomize calls
    this in every process of a run: pytest and its spawned ranks); under torchrun, write the node rank to
    FALSE_ALARMS_NODE_FILE, since the rendezvous numbers the nodes."""
    import os
    from pathlib import Path

    speed = os.environ.get("FALSE_ALARMS_SPEED")
    if speed is None:
        return
    _installed.enter_context(slowed(float(speed)))
    node_file = os.environ.get("FALSE_ALARMS_NODE_FILE")
    if node_file and "GROUP_RANK" in os.environ:
        Path(node_file).write_text(os.environ["GROUP_RANK"])


_installed = contextlib.ExitStack()
