"""The ranks a check runs on: a gang of local processes, one per GPU (or two on the CPU), or the torchrun /
srun world this process already belongs to."""
