"""What a run was computed on, as its run.json records it: the processor (model, vector extensions), the thread
settings and the versions of the numerical libraries, and the machine's load. Two runs of the same settings may
differ in the last bits when any of these differ (another matrix kernel, another summation order); ``differences``
says which did, for ``runner verify``. Reads /proc and package metadata only: no torch import."""

from __future__ import annotations

import os
import platform
from importlib import metadata

PACKAGES = ("torch", "flwr", "numpy", "ray")
# the extensions that choose oneDNN's and OpenBLAS's kernels on x86 (and NEON/SVE on ARM)
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "asimd", "sve")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE")


def processor() -> dict:
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and model is None:
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:  # no /proc (not Linux): what the platform module says
        pass
    return {
        "model": model or platform.processor() or platform.machine(),
        "architecture": platform.machine(),
        "cores": os.cpu_count(),
        "vector_extensions": [f for f in VECTOR_FLAGS if f in flags],
    }


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def machine_record(lanes: int, ray_cpus: int | None, ray: str | None = None) -> dict:
    """The run.json entry ``machine``: processor, versions, thread settings, the lanes the runner used and where the
    run's Ray ran (none of it is part of a run's identity)."""
    return {
        "processor": processor(),
        "versions": versions(),
        "threads": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        "lanes": lanes,
        "ray_cpus_per_run": ray_cpus,
        **({"ray": ray} if ray else {}),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


COMPARED = ("processor", "versions", "threads")


def differences(committed: dict | None, new: dict | None) -> list[str]:
    """What differs between two runs' ``machine`` entries that can change the last bits of a result (the processor,
    its vector extensions, a library version, a thread setting); a run made before machines were recorded says so."""
    if not committed:
        return ["the committed run recorded no machine (made before run.json held one)"]
    found = []
    for part in COMPARED:
        old, now = committed.get(part) or {}, (new or {}).get(part) or {}
        for key in sorted(set(old) | set(now)):
            if key != "cores" and old.get(key) != now.get(key):
                found.append(f"{part} {key}: {old.get(key)!r} -> {now.get(key)!r}")
    return found
