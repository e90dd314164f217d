"""Where a hung rank of a local gang is stuck: the innermost frame of its faulthandler dump, and whether that
frame is one of a rank waiting for a peer or of the likely culprit. No torch here: this reads text."""

from __future__ import annotations

# Where a rank waiting for a peer is stuck: in a collective (gloo blocks there), or, under NCCL, whose collectives
# return at once and run on the GPU, in a device synchronisation that waits for one. A rank stuck elsewhere is the
# likely culprit. (A `.item()` that waits for a collective's result shows only its caller's frame: such a rank
# cannot be told from a culprit, and then none is named.)
_WAITING_IN = ("torch/distributed/", "torch/cuda/", "torch/accelerator/")


def waiting_for_a_peer(frame: str | None) -> bool:
    """Whether a rank whose innermost frame is `frame` ('file:line in function'; None: unknown) is waiting."""
    return frame is None or any(place in frame for place in _WAITING_IN)


def innermost_frame(dump: str) -> str:
    """'file:line in function' of the innermost frame of a faulthandler dump."""
    frames = [line.strip() for line in dump.splitlines() if line.strip().startswith("File ")]
    return frames[0].removeprefix("File ").replace('"', "") if frames else "unknown"
