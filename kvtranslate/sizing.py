"""Sizing a translator to a parameter count, so that kinds can be compared at equal capacity.

Each kind has width knobs (WIDTH_KNOBS): the per-layer MLP width `hidden` (the expert width of the mixture kinds)
and, for the kinds with a shared latent space, the latent width. Sizing sets every knob the caller did not fix to
one width w and picks the w in WIDTH_RANGE whose parameter count is closest to the target; at the defaults
(hidden = latent = 256) every kind is the translator the earlier studies trained. The count comes from the
translator module itself, built on the meta device (no memory, no initialisation cost).
"""

from typing import Any

import torch

from .models import ModelPair, kv_geometry, source_geometry
from .translators import KINDS, KVTranslator

WIDTH_KNOBS = {
    "mot": ("hidden",),
    "single": ("hidden",),
    "shared-latent": ("hidden", "latent"),
    "mot-latent": ("hidden", "latent"),
    "no-source": ("hidden", "latent"),
}
WIDTH_RANGE = (8, 4096)  # below 8 a layer's MLP is degenerate; above 4096 the tiny pairs' translators pass 100M
SIZE_TOLERANCE = 0.02  # relative distance from the target count that sizing accepts
# the constructor's architecture arguments a settings dict may carry (training settings are ignored here)
ARCHITECTURE = (
    "kind",
    "k_layers",
    "hidden",
    "n_experts",
    "gating",
    "top_k",
    "latent",
    "window",
    "embed_dim",
    "src_window",
    "target_input",
)


def translator_parameters(
    source_geom: dict[str, int], target_geom: dict[str, int], target_embed_dim: int, settings: dict[str, Any]
) -> int:
    """Trainable parameters of the translator `settings` (ARCHITECTURE keys; the rest is ignored) would build."""
    arch = {k: settings[k] for k in ARCHITECTURE if k in settings}
    with torch.device("meta"):
        translator = KVTranslator(source_geom, target_geom, target_embed_dim, **arch)
    return sum(p.numel() for p in translator.parameters())


def free_knobs(kind: str, fixed: set[str] | frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The width knobs of `kind` that sizing sets (those not in `fixed`), else an error naming what is missing."""
    if kind not in WIDTH_KNOBS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    knobs = tuple(k for k in WIDTH_KNOBS[kind] if k not in fixed)
    if not knobs:
        raise ValueError(
            f"params: kind {kind!r} has no width left to size (its knobs {WIDTH_KNOBS[kind]} are all set explicitly)"
        )
    return knobs


def size_to_params(
    source_geom: dict[str, int],
    target_geom: dict[str, int],
    target_embed_dim: int,
    settings: dict[str, Any],
    params: int,
    fixed: set[str] | frozenset[str] = frozenset(),
    tolerance: float = SIZE_TOLERANCE,
) -> dict[str, Any]:
    """`settings` with the kind's free width knobs (not in `fixed`) set to the width whose translator's parameter
    count is closest to `params`. A target outside what WIDTH_RANGE reaches, or one no width meets within
    `tolerance`, is an error naming `params` and the reachable range."""
    knobs = free_knobs(settings["kind"], fixed)

    def count(width: int) -> int:
        return translator_parameters(
            source_geom, target_geom, target_embed_dim, {**settings, **dict.fromkeys(knobs, width)}
        )

    low, high = WIDTH_RANGE
    smallest, largest = count(low), count(high)
    if not smallest <= params <= largest:
        raise ValueError(
            f"params={params:,} is out of reach for kind {settings['kind']!r} on this pair: its {'/'.join(knobs)} "
            f"widths {low}-{high} give {smallest:,} to {largest:,} parameters (allowed range of params)"
        )
    # the count grows with the width: the smallest width reaching the target, or the one below it
    while low < high:
        mid = (low + high) // 2
        if count(mid) < params:
            low = mid + 1
        else:
            high = mid
    width = min((w for w in (low - 1, low) if w >= WIDTH_RANGE[0]), key=lambda w: abs(count(w) - params))
    reached = count(width)
    if abs(reached - params) > tolerance * params:
        raise ValueError(
            f"params={params:,}: the nearest width {width} of kind {settings['kind']!r} gives {reached:,} parameters, "
            f"more than {tolerance:.0%} away (fix another setting, or choose a target nearer {reached:,})"
        )
    return {**settings, **dict.fromkeys(knobs, width)}


def size_for_pair(
    pair: ModelPair, settings: dict[str, Any], params: int, fixed: set[str] | frozenset[str] = frozenset()
) -> dict[str, Any]:
    """`size_to_params` for the pair's cache shapes and the target's embedding width."""
    target_geom = kv_geometry(pair.target)
    return size_to_params(source_geometry(pair), target_geom, target_geom["hidden"], settings, params, fixed)
