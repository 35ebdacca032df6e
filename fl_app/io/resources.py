"""Locate files bundled with the fl_app package (supernet configs, subnet caches, the offline data sample).

``flwr run`` executes a copy of the app's code (a FAB) that carries only source files, so bundled data is looked up
in the package itself first and then in the installed ``fl-app`` distribution (editable or not) it was copied from.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

PACKAGE_DIR = Path(__file__).parents[1]  # the fl_app package root (this module lives in fl_app/run/)


def _installed_package_dir() -> Path | None:
    try:
        dist = importlib.metadata.distribution("fl-app")
    except importlib.metadata.PackageNotFoundError:
        return None
    direct_url = dist.read_text("direct_url.json")
    if direct_url:
        info = json.loads(direct_url)
        if info.get("dir_info", {}).get("editable"):
            return Path(unquote(urlparse(info["url"]).path)) / "fl_app"
    return Path(str(dist.locate_file("fl_app")))


def bundled_file(relative: str) -> Path:
    """Path of a file shipped inside ``fl_app`` (e.g. ``supernet_configs/cpu-cache.csv``)."""
    bases = [base for base in (PACKAGE_DIR, _installed_package_dir()) if base is not None]
    for base in bases:
        if (base / relative).exists():
            return base / relative
    # a FAB copy of the app carries no CSV files, so a run finds them only in the installed checkout: name both places
    raise FileNotFoundError(
        f"bundled file fl_app/{relative} not found in {' or '.join(str(b) for b in bases)}; install this checkout "
        "(pip install -e .) so that runs started from it find its bundled files"
    )
