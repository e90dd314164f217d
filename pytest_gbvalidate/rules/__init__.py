"""The rules that decide: every verdict the gate gives is made here, on numbers, and nowhere else. No torch, no
pytest, no I/O.

- noise.py: a figure's spread and waits for a CPU, the node's run-to-run spread, the MAD constant and modified z.
- resolution.py: what a figure's evidence can tell, the one "worse" rule, and `side`, which decides a figure against
  any threshold. pace.py: a run against the node's history; allowed.py: the change --gb-compare allows by default.
- sampling.py: when a check measures its figures once more; outliers.py: a node against the fleet, a device against
  its siblings.
"""
