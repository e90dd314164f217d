"""Termination signals end a run as Ctrl-C does, so its report says `interrupted` rather than `running`."""

from __future__ import annotations

import signal
import threading
from typing import Any


def stop_on_termination_signals() -> dict[int, Any]:
    """SIGTERM (Slurm's scancel and time limit, Kubernetes deleting a pod) and SIGHUP (a closed terminal) end the
    run as Ctrl-C does: pytest's interrupted path tears the ranks down, writes the report `"interrupted"`, records
    nothing and exits 2. Python's default for them ends the process at once, leaving the report "running". Only
    where a handler can be set (the main thread). The handlers replaced, to put back when the session ends."""
    replaced: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return replaced
    for number in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(number) in (signal.SIG_DFL, None):  # leave a handler someone else set alone
            replaced[number] = signal.signal(number, _interrupt)
    return replaced


def put_back(replaced: dict[int, Any]) -> None:
    for number, handler in replaced.items():
        signal.signal(number, handler)


def _interrupt(number: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(number).name}")
