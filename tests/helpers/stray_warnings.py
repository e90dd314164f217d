"""A pytest plugin one test loads (`-p tests.helpers.stray_warnings`) into an operator-style run of the suites from the
checkout, never a real run: in every test it does what libraries do now and then, warns, and drops a directory
iterator it left open (a ResourceWarning when it is collected)."""

from __future__ import annotations

import os
import warnings

import pytest


def pytest_runtest_call(item: pytest.Item) -> None:
    warnings.warn("a library's deprecation notice", UserWarning, stacklevel=1)
    entries = os.scandir(item.path.parent)
    next(entries)
    del entries  # unclosed: CPython finalises it here and reports it to sys.unraisablehook
