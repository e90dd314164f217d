"""Check levels: how much of the suites a run takes on, for how often it runs (no pytest here).

`passive` measures nothing and loads nothing: inventory, driver, ECC, row remapping, Xid, clocks, links, fabric and
IMEX state, topology -- what slurmd's hooks may run beside a job (HealthCheckProgram, Prolog, Epilog). `quick`
adds one short measurement of each path (a copy, a GEMM, one all_reduce): a Kubernetes init container, a node no
job holds. `standard` adds the bandwidths, GEMMs and collective sweeps the baseline gates, silent data corruption
and storage. `full`, the acceptance gate, adds the training and inference checks. A level runs its own checks and
those of the levels below; a check with no level is a `full` check.
"""

from __future__ import annotations

from typing import Literal, get_args

Level = Literal["passive", "quick", "standard", "full"]
LEVELS: tuple[Level, ...] = get_args(Level)
DEFAULT_LEVEL: Level = "full"
MARKER = "gb_level"
# What a level may take on a 4-GPU ND GB200 v6 node (docs/levels.md has the arithmetic): shown beside what it took.
BUDGET_S: dict[Level, float] = {"passive": 30.0, "quick": 60.0, "standard": 600.0, "full": 900.0}


class LevelError(ValueError):
    """A level name that is not one of LEVELS."""


def parse_level(raw: object) -> Level:
    word = raw.strip().lower() if isinstance(raw, str) else raw
    for level in LEVELS:
        if word == level:
            return level
    raise LevelError(f"not a level: one of {', '.join(LEVELS)}")


def runs(run_level: Level, check_level: Level) -> bool:
    """Whether a run at `run_level` runs a check of `check_level`: its own level's and those below."""
    return LEVELS.index(check_level) <= LEVELS.index(run_level)
