"""The NCCL stack of the node: the version torch loads and from where, the topology file NCCL is told to read, and
the net plugin NCCL would load. Each answer says where it looked. No pytest here."""

from __future__ import annotations

import ctypes
import os
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path

# Where NCCL reads settings besides its environment (NCCL's environment-variables documentation: NCCL_CONF_FILE,
# then ~/.nccl.conf, then /etc/nccl.conf). The Azure HPC images set NCCL_TOPO_FILE in /etc/nccl.conf.
SYSTEM_CONF = Path("/etc/nccl.conf")
MAPS = Path("/proc/self/maps")


def loaded_version() -> tuple[str, str]:
    """(the NCCL version torch loads, where it was found: torch's answer, the library /proc/self/maps shows)."""
    import torch

    version = ".".join(str(part) for part in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    library = next((line.split()[-1] for line in _maps() if "libnccl.so" in line), None)
    where = f"torch.cuda.nccl.version() of torch {torch.__version__}"
    return version, where + (f", library {library}" if library else "")


def _maps() -> list[str]:
    try:
        return MAPS.read_text().splitlines()
    except OSError:
        return []


def conf_files(env: Mapping[str, str]) -> list[Path]:
    """The configuration files NCCL reads, in its order of precedence."""
    files = [Path(env["NCCL_CONF_FILE"])] if env.get("NCCL_CONF_FILE") else []
    return [*files, Path.home() / ".nccl.conf", SYSTEM_CONF]


def setting(name: str, env: Mapping[str, str], files: list[Path]) -> tuple[str, str] | None:
    """(value, where it was set) of an NCCL variable: the environment wins, then the first file that sets it."""
    if env.get(name):
        return env[name], "the environment"
    for path in files:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, sep, value = line.partition("=")
            if sep and key.strip() == name and value.strip():
                return value.strip(), str(path)
    return None


def topo_file_problem(value: str, source: str, cwd: Path) -> tuple[Path, str | None]:
    """(the file NCCL_TOPO_FILE names, resolved as NCCL would against `cwd`; why it cannot be used, or None)."""
    path = (cwd / value).resolve()
    named = f"NCCL_TOPO_FILE={value} (from {source})" + ("" if Path(value).is_absolute() else f" resolves to {path}")
    if not path.exists():
        return path, f"{named}: no such file"
    try:
        text = path.read_bytes()
    except OSError as exc:
        return path, f"{named}: cannot be read: {exc.strerror or exc}"
    try:
        root = ET.fromstring(text)  # noqa: S314 -- a file of this node, named by its own NCCL settings
    except ET.ParseError as exc:
        return path, f"{named}: not valid XML: {exc}"
    if root.tag != "system":
        return path, f"{named}: its root element is <{root.tag}>, an NCCL topology has <system>"
    return path, None


def net_plugin(default: str, env: Mapping[str, str], files: list[Path]) -> tuple[str | None, str]:
    """(the net plugin library NCCL loads, what chose it): NCCL_NET_PLUGIN where set (a library name or path is
    taken as is, `none` loads none, anything else is the suffix of libnccl-net-<suffix>.so), else `default`."""
    if (named := setting("NCCL_NET_PLUGIN", env, files)) is None:
        return default, "the baseline's health.nccl_net_plugin"
    value, source = named
    chosen = f"NCCL_NET_PLUGIN={value} (from {source})"
    if value.lower() == "none":
        return None, chosen
    return (value if ".so" in value or "/" in value else f"libnccl-net-{value}.so"), chosen


def load_problem(library: str) -> str | None:
    """Why `library` cannot be loaded as NCCL loads its net plugin (dlopen: LD_LIBRARY_PATH, the loader's cache)."""
    try:
        ctypes.CDLL(library)
    except OSError as exc:
        path = os.environ.get("LD_LIBRARY_PATH", "")
        return f"cannot load {library}: {exc} (LD_LIBRARY_PATH={path or 'unset'}, then the loader's cache)"
    return None
