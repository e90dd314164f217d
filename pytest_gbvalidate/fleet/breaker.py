"""The breaker: the fleet summary never prints drain lines for more than a share and a number of the fleet's nodes
at once. A baseline, an image or a fabric that is wrong fails every node alike, and a drain line for each would take
the fleet out for a cause no node has; past the breaker the likelier cause is fleet-wide, and a person looks first.

The share is of the fleet's GPU nodes (its nodes of the fleet's SKU, with the hosts a multi-node run named): 50% by
default, where NVIDIA's NVSentinel stops cordoning. The number is off by default, settable for a large fleet (where
a share is many nodes: NVSentinel added an absolute maximum for the other end, 1% of 288 nodes being 3). A fleet
always may drain one node. No pytest here."""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_MAX_PCT = 50.0


@dataclass(frozen=True)
class Breaker:
    max_pct: float = DEFAULT_MAX_PCT  # of the fleet's nodes, at most, taken out at once
    max_nodes: int | None = None  # and at most this many; None: the share alone

    def allowed(self, fleet_nodes: int) -> int:
        """How many of `fleet_nodes` may be taken out at once (one at least)."""
        by_share = math.floor(self.max_pct / 100 * fleet_nodes + 1e-9)
        return max(1, min(by_share, self.max_nodes if self.max_nodes is not None else by_share))

    def tripped(self, to_drain: int, fleet_nodes: int) -> str | None:
        """Why no drain line is printed, where `to_drain` is more than allowed; else None."""
        allowed = self.allowed(fleet_nodes)
        if to_drain <= allowed:
            return None
        number = "" if self.max_nodes is None else f", {self.max_nodes} at most"
        return (
            f"breaker tripped: {to_drain} of {fleet_nodes} nodes to take out, more than the {allowed} allowed at once "
            f"({self.max_pct:g}% of the fleet{number}: --max-drain-pct, --max-drain): a fleet-wide cause -- the "
            "baseline, the image, the fabric -- is likelier than that many failing nodes; no drain line printed, "
            "look at what they share first"
        )
