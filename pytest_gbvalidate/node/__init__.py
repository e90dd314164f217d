"""What the node is: facts for reports, and probes of its GPUs, NUMA topology, kernel log and telemetry."""
