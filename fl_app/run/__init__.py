"""Run bookkeeping shared by every method: the run-config registry, wire payloads, checkpoints, output files,
statistics for reports, bundled files and the compute device."""
