"""Where a hung rank of a local gang is stuck (its faulthandler dump's innermost frame), and whether it is waiting
for a peer or the likely culprit. No torch here: this reads text."""

from __future__ import annotations

# Where a rank waiting for a peer is stuck: in a collective (gloo), or in a device synchronisation (NCCL's run on the
# GPU). A `.item()` waiting for a collective's result shows only its caller's frame, as a culprit's does.
_WAITING_IN = ("torch/distributed/", "torch/cuda/", "torch/accelerator/")


def waiting_for_a_peer(frame: str | None) -> bool:
    """Whether a rank whose innermost frame is `frame` ('file:line in function'; None: unknown) is waiting."""
    return frame is None or any(place in frame for place in _WAITING_IN)


def innermost_frame(dump: str) -> str:
    """'file:line in function' of the innermost frame of a faulthandler dump."""
    frames = [line.strip() for line in dump.splitlines() if line.strip().startswith("File ")]
    return frames[0].removeprefix("File ").replace('"', "") if frames else "unknown"
