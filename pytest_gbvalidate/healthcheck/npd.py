"""Kubernetes node-problem-detector (NPD) custom plugin: the exit code and the one line of the plugin protocol
(github.com/kubernetes/node-problem-detector, pkg/custompluginmonitor):

- exit status 0 OK, 1 NonOK, 2 Unknown (types/types.go); any other is Unknown too (plugin/plugin.go).
- stdout, trimmed, is the condition's message, cut at `max_output_length` bytes: 80 by default
  (types/config.go, defaultMaxOutputLength). NPD reads at most 4 KiB of it.
- At the rule's timeout NPD kills the plugin's process group and reports Unknown with a message of its own; the
  deadline here ends the run first, so the message says which level ran past it.

NonOK: a check failed. Unknown: past the deadline, as NPD's own timeout is (slurm.py drains such a node), or no
verdict. The message holds no duration or count that changes from run to run where the verdict does not, so
`enable_message_change_based_condition_update` may be on without churning the condition."""

from __future__ import annotations

from pytest_gbvalidate.fleet.text import shorten
from pytest_gbvalidate.healthcheck.verdict import FAIL, OK, TIMEOUT, Verdict, escaped

EXIT_OK, EXIT_NONOK, EXIT_UNKNOWN = 0, 1, 2
STATUS_WORDS = {EXIT_OK: "OK", EXIT_NONOK: "NonOK", EXIT_UNKNOWN: "Unknown"}  # node-problem-detector's names
DEFAULT_MAX_OUTPUT_LENGTH = 80
MIN_OUTPUT_LENGTH = 20  # room for a verdict's first words


def exit_code(verdict: Verdict) -> int:
    return {OK: EXIT_OK, FAIL: EXIT_NONOK}.get(verdict.state, EXIT_UNKNOWN)


def line(verdict: Verdict, max_chars: int, *notes: str) -> str:
    """The condition's message, printable ASCII (so bytes and characters agree), at most `max_chars`."""
    if verdict.state == OK:
        text = f"{verdict.level} GPU node checks pass"
    elif verdict.state == FAIL:  # the categories first: the message is cut at max_chars (80 by default)
        text = "; ".join(part for part in [verdict.categories(), verdict.cause, *verdict.findings()] if part)
    elif verdict.state == TIMEOUT:
        text = "unknown: " + "; ".join(verdict.findings())
    else:
        text = f"unknown: {verdict.detail}"
    return one_line("; ".join(part for part in (text, verdict.confirmation(), *notes) if part), max_chars)


def one_line(text: str, max_chars: int) -> str:
    return shorten(escaped(text), max_chars)
