"""Run bookkeeping shared by every method: the run-config registry, wire payloads, checkpoints, output files,
the run's life from folder to summary, statistics for reports and the compute device. It sits above ``data`` and
``models`` (the run config checks values against their tables) and below ``supernet``."""
