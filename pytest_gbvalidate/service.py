"""Taking a node out of service: the names and texts a line that drains, cordons, taints or labels a node may hold.
Pure Python. A hostname, a fault category and a test id all come from a report or the node and are untrusted:
each function returns None (or a reason) rather than let anything but one valid name into a command.

- Slurm: `scontrol update nodename=X` reads `,`, `[1-9]`, spaces and the word ALL as several nodes. A node name
  here is one DNS label (RFC 1123) or an IP address (without an IPv6 scope id: `fe80::1%eth0`), as `hostname
  -s` gives it (Slurm's NodeName convention).
- Kubernetes: a node's name is a DNS-1123 subdomain (lower case, at most 253 characters), the hostname lowercased
  as the kubelet takes it (k8s.io/component-helpers/node/util GetHostname: TrimSpace, ToLower). Label and taint
  values and the name part of a key follow apimachinery's pkg/util/validation/validation.go: IsValidLabelValue
  (at most 63 characters of [A-Za-z0-9._-], alphanumeric at both ends, or empty) and IsQualifiedName (an optional
  DNS-1123 subdomain prefix and `/`, then a name of at most 63 characters of the same kind).
"""

from __future__ import annotations

import ipaddress
import re

from pytest_gbvalidate.labels import printable

# One DNS label (RFC 1123): letters, digits and inner hyphens, at most 63.
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
# What Slurm's hostlist reads as several nodes, or as something else than a name: `,` and whitespace separate
# names, brackets make a range, `%` starts an IPv6 scope id.
_NOT_ONE_NODE = re.compile(r"[,\[\]%\s]")
_DNS1123_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")
DNS1123_SUBDOMAIN_MAX_CHARS = 253
LABEL_VALUE_MAX_CHARS = 63


def slurm_node_name(hostname: str) -> str | None:
    """The Slurm node name of a hostname, as `hostname -s` gives it (up to the first dot; an IP address whole);
    None where it would not name exactly one node."""
    name = _short_name(hostname)
    # Whatever the parsing let through, no name reaches a drain line that Slurm's hostlist could read as more
    # than one node: a list, a range, a word break, or the `%` of a scope id.
    return None if name is None or _NOT_ONE_NODE.search(name) else name


def _short_name(hostname: str) -> str | None:
    try:
        address = ipaddress.ip_address(hostname)
    except ValueError:
        pass
    else:
        # ipaddress takes any text after an IPv6 address's `%` as its scope id (`fe80::1%n1,gpu[001-128]`): an
        # interface of this machine, never part of a Slurm node name.
        return None if isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None else str(address)
    if len(hostname) > DNS1123_SUBDOMAIN_MAX_CHARS or not all(_LABEL.fullmatch(p) for p in hostname.split(".")):
        return None
    short = hostname.split(".", 1)[0]
    return None if short.upper() == "ALL" else short


def kubernetes_node_name(hostname: str) -> str | None:
    """The Kubernetes node name of a hostname (lowercased, as the kubelet registers it), or None where that is no
    DNS-1123 subdomain."""
    name = hostname.lower()
    if not name.isascii() or len(name) > DNS1123_SUBDOMAIN_MAX_CHARS:
        return None
    return name if all(_DNS1123_LABEL.fullmatch(p) for p in name.split(".")) else None


def label_value_problem(value: str) -> str | None:
    """Why `value` cannot be a Kubernetes label or taint value, or None."""
    if len(value) > LABEL_VALUE_MAX_CHARS:
        return f"{printable(value)!r} is longer than {LABEL_VALUE_MAX_CHARS} characters"
    if value and not (value.isascii() and _QUALIFIED_NAME.fullmatch(value)):
        return f"{printable(value)!r} is not alphanumeric at both ends with only [A-Za-z0-9._-] between"
    return None


def qualified_name_problem(key: str) -> str | None:
    """Why `key` cannot be a Kubernetes label or taint key (`prefix/name`), or None."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or kubernetes_node_name(prefix) != prefix):
        return f"{printable(key)!r}: the prefix is no DNS-1123 subdomain"
    if not name or label_value_problem(name) is not None:
        return f"{printable(key)!r}: the name is not 1 to {LABEL_VALUE_MAX_CHARS} of [A-Za-z0-9._-], alnum ends"
    return None


def reason_text(text: str, limit: int) -> str:
    """`text` as a drain reason: one line of printable ASCII (anything else escaped), no quotes or backslashes
    (scontrol strips a quote at either end; a shell or a log parser reads the rest), at most `limit` characters."""
    shown = printable(re.sub(r"\s+", " ", text).strip())
    shown = re.sub(r"[\"'`\\]", "", shown)
    return shown if len(shown) <= limit else shown[: limit - 3].rstrip() + "..."
