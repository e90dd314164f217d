"""Termination signals end a run as Ctrl-C does, so its report says `interrupted` rather than `running`; the first
one counts, and none cuts the writing of the run's outputs short."""

from __future__ import annotations

import signal
import threading
from typing import Any

STOPS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Stopper:
    """SIGTERM (Slurm's scancel and time limit, Kubernetes deleting a pod), SIGHUP (a closed terminal) and SIGINT
    (Ctrl-C) end the run as Ctrl-C does: pytest's interrupted path tears the ranks down, writes the report
    `"interrupted"`, records nothing and exits 2. Python's default for SIGTERM and SIGHUP ends the process at once,
    leaving the report "running".

    Only the first signal stops the run. A second one (Ctrl-C pressed twice, scancel then slurmd's own SIGTERM)
    used to land in pytest's own interrupted path, which then never set the exit status: the report said
    `finished`, exit status 0, over a part of the checks, and --gb-record wrote a baseline from that part. Once the
    outputs are being written (`finishing`), a signal no longer interrupts: cut there, the report stayed `running`
    and the JUnit, Prometheus and history files were lost, after every check had run. `cut_short` says whether a
    signal stopped the checks, whatever pytest's exit status says."""

    def __init__(self) -> None:
        self.replaced: dict[int, Any] = {}  # the handlers replaced, to put back when the session ends
        self.signal_name: str | None = None  # the first signal's, once one came
        self.cut_short = False
        self._finishing = False

    def install(self) -> None:
        """Only where a handler can be set (the main thread), and over no handler someone else set."""
        if threading.current_thread() is not threading.main_thread():
            return
        for number in STOPS:
            if signal.getsignal(number) in (signal.SIG_DFL, signal.default_int_handler, None):
                self.replaced[number] = signal.signal(number, self._interrupt)

    def finishing(self) -> None:
        """The checks are over and the outputs are being written: a signal from now on is noted, not raised."""
        self._finishing = True

    def put_back(self) -> None:
        for number, handler in self.replaced.items():
            signal.signal(number, handler)
        self.replaced = {}

    def _interrupt(self, number: int, _frame: object) -> None:
        if self.signal_name is not None:  # the run is stopping already
            return
        self.signal_name = signal.Signals(number).name
        if not self._finishing:
            self.cut_short = True
            raise KeyboardInterrupt(f"stopped by {self.signal_name}")
