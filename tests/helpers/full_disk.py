"""A directory on a full file system, for runs whose files must meet a real ENOSPC: a small tmpfs of the command's
own, in a mount namespace of its own (`unshare -m` for root, `unshare -rm` for a user who is not), filled before
the command runs. What the directory holds afterwards (the fill left out) is copied beside it as `<name>.after`:
the tmpfs goes with the namespace. Where namespaces are not allowed (some containers), None: the test skips."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path


def _unshare() -> list[str] | None:
    if not shutil.which("unshare"):
        return None
    flags = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    probe = subprocess.run([*flags, "true"], capture_output=True, timeout=30)
    return flags if probe.returncode == 0 else None


def on_full_disk(directory: Path, files: dict[str, str], command: list[str]) -> list[str] | None:
    """The command line that runs `command` with `directory` full, holding `files` (name -> text) written before
    it filled; None where this machine allows no mount namespace."""
    flags = _unshare()
    if flags is None:
        return None
    where, after = shlex.quote(str(directory)), shlex.quote(f"{directory}.after")
    written = " && ".join(
        f"printf %s {shlex.quote(text)} > {where}/{shlex.quote(name)}" for name, text in files.items()
    )
    script = (
        f"mount -t tmpfs -o size=256k tmpfs {where} && {written or 'true'} && "
        f"{{ dd if=/dev/zero of={where}/fill bs=4k 2>/dev/null; true; }} && "
        f"{{ {shlex.join(command)}; status=$?; }}; "
        f"rm -f {where}/fill; mkdir -p {after} && cp -a {where}/. {after}/; exit $status"
    )
    return [*flags, "bash", "-c", script]
