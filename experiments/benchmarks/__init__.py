"""Timings and device checks: how fast the app and its parts run (Flower against a plain loop, aggregation, traffic,
scale, start-up, local training, compilation) and `gpu_check.sh`, the short check of a CUDA machine."""
