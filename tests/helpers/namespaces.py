"""Commands run in Linux namespaces of their own, for faults a test cannot otherwise make without changing the
machine: a file system of their own (a full disk), a hostname of their own. `unshare` as root, `unshare -r` (a
user namespace mapping the user to root) for a user who is not. Where neither is allowed (some containers), None:
the test skips."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys


def unshare(*kinds: str) -> list[str] | None:
    """`unshare` with `kinds` (`-m` a mount namespace, `-u` a hostname's), where this machine allows it."""
    if not shutil.which("unshare"):
        return None
    flags = ["unshare", *kinds] if os.geteuid() == 0 else ["unshare", "-r", *kinds]
    probe = subprocess.run([*flags, "true"], capture_output=True, timeout=30)
    return flags if probe.returncode == 0 else None


def with_hostname(hostname: str, command: list[str]) -> list[str] | None:
    """`command` run where the hostname is `hostname` (any characters the kernel takes: set by Python, as the
    `hostname` tool refuses some)."""
    flags = unshare("-u")
    if flags is None:
        return None
    set_it = shlex.join([sys.executable, "-c", f"import socket; socket.sethostname({hostname!r})"])
    return [*flags, "bash", "-c", f"{set_it} && exec {shlex.join(command)}"]
