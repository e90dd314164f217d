"""A directory on a full file system, for runs whose files must meet a real ENOSPC: a small tmpfs of the command's
own, in a mount namespace of its own (tests/helpers/namespaces.py), filled before the command runs. What the
directory holds afterwards (the fill left out) is copied beside it as `<name>.after`: the tmpfs goes with the
namespace. Where namespaces are not allowed (some containers), None: the test skips."""

from __future__ import annotations

import shlex
from pathlib import Path

from tests.helpers.namespaces import unshare


def on_full_disk(directory: Path, files: dict[str, str], command: list[str]) -> list[str] | None:
    """The command line that runs `command` with `directory` full, holding `files` (name -> text) written before
    it filled; None where this machine allows no mount namespace."""
    flags = unshare("-m")
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
