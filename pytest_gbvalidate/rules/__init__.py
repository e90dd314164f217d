"""The rules that decide: every verdict the gate gives is made here, on numbers, and nowhere else. No torch, no
pytest, no I/O.

- noise.py: a figure's spread (the scaled MAD of its samples or passes, the waits for a CPU it saw), the node's
  run-to-run spread, the one MAD constant and modified z, the family-wise cut-off.
- resolution.py: what a figure's evidence can tell, the `Direction` and the one "worse" rule, and `side`, which
  decides a figure against any threshold (a fail or warn limit, the change --gb-compare allows).
- pace.py: a run as a whole against the node's history; allowed.py: the change --gb-compare allows by default.
- sampling.py: when a check measures its figures once more.
- outliers.py: a node against the fleet's other nodes, a device against its siblings.
"""
