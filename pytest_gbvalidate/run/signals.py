"""Termination signals end a run as Ctrl-C does, so its report says `interrupted` rather than `running`; the first
one counts, and none cuts the writing of the run's outputs short."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import pytest

STOPS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Stopper:
    """SIGTERM (Slurm's scancel and time limit, Kubernetes deleting a pod), SIGHUP (a closed terminal) and SIGINT
    (Ctrl-C) end the run as Ctrl-C does (pytest's interrupted path: the report `"interrupted"`, exit 2); Python's
    default for SIGTERM and SIGHUP ends the process at once, leaving the report "running".

    Only the first signal stops the run: a second would land in pytest's own interrupted path, which never sets the
    exit status (the report would say `finished` over part of the checks). Once the outputs are being written
    (`finishing`), a signal no longer interrupts, so they are not lost. `cut_short`: whether a signal stopped the
    checks, whatever pytest's exit status says."""

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


def end_now(config: pytest.Config, session: pytest.Session | None) -> NoReturn:
    """A rank whose process group failed ends here, its reports written, with the run's exit status: left to the
    interpreter's exit, torch's NCCL watchdog holds it (each queued collective timing out in turn) or crashes it."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:  # what pytest still holds of the output, to the terminal
        capture.stop_global_capturing()
    status = int(session.exitstatus) if session is not None else 1
    print(f"gbvalidate: this rank's process group failed; it exits now ({status}), not waiting on torch's threads")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
