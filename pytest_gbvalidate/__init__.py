"""pytest-gbvalidate: GPU-node hardware validation as pytest suites with per-SKU baselines."""

__version__ = "0.1.0"
