"""Device-agnostic measurements (copies, GEMMs, collectives) and the functions the gang runs them with on each
rank; no pytest, no baselines."""
