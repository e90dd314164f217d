"""The ranks a check runs on: a gang of local processes, one per GPU (or two on the CPU), or the torchrun /
srun world this process already belongs to."""

# Ranks of a gang on a CPU-only SKU: enough for every collective and PP=2, cheap on 2 cores.
CPU_RANKS = 2
