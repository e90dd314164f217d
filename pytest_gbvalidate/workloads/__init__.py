"""Training workloads the suites run end to end (a compact Llama 3 and its parallel layouts)."""
