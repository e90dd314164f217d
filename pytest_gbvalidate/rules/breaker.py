"""The breaker: neither the fleet summary's drain lines nor the health check's own drain take out more than a share
and a number of the fleet's nodes at once. A wrong baseline, image or fabric fails every node alike; past the breaker
the likelier cause is fleet-wide, and a person looks first.

The share is of the fleet's GPU nodes (the summary's nodes of the fleet's SKU, with the hosts a multi-node run named;
the Slurm cluster's nodes with a GPU for the health check): 50% by default, where NVIDIA's NVSentinel stops
cordoning. The number is off by default, for a large fleet (NVSentinel added an absolute maximum for the other end,
1% of 288 nodes being 3). A fleet always may drain one node. No pytest here."""

from __future__ import annotations

import argparse
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

    def tripped(self, to_drain: int, fleet_nodes: int, held: str = "no drain line printed") -> str | None:
        """Why nothing is drained (`held` says what is not done), where `to_drain` is more than allowed; else None."""
        allowed = self.allowed(fleet_nodes)
        if to_drain <= allowed:
            return None
        number = "" if self.max_nodes is None else f", {self.max_nodes} at most"
        return (
            f"breaker tripped: {to_drain} of {fleet_nodes} nodes to take out, more than the {allowed} allowed at once "
            f"({self.max_pct:g}% of the fleet{number}: --max-drain-pct, --max-drain): a fleet-wide cause -- the "
            f"baseline, the image, the fabric -- is likelier than that many failing nodes; {held}, look at what "
            "they share first"
        )


def add_options(parser: argparse.ArgumentParser, held: str) -> None:
    """The breaker's two settings on a command line; `held` says what the command then does not do."""
    parser.add_argument(
        "--max-drain-pct",
        type=_share_pct,
        default=DEFAULT_MAX_PCT,
        metavar="PCT",
        help=f"{held} where more than PCT%% of the fleet's GPU nodes would be out at once: the breaker (default "
        f"{DEFAULT_MAX_PCT:g}; one node always may)",
    )
    parser.add_argument(
        "--max-drain", type=_count, default=None, metavar="N", help="nor where more than N would (default: none)"
    )


def from_options(args: argparse.Namespace) -> Breaker:
    return Breaker(args.max_drain_pct, args.max_drain)


def _share_pct(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 100:  # NaN too
        raise argparse.ArgumentTypeError(f"{text[:40]!a}: a share in percent, from 0 to 100")
    return value


def _count(text: str) -> int:
    if not (text.isdecimal() and len(text) <= 6 and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"{text[:40]!a}: a whole number from 1 to 999999")
    return int(text)
