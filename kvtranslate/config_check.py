"""A saved translator's config.json checked before anything is built from it.

`from_pretrained` used to pass config.json straight to the constructor: an unknown key ended in a TypeError, a
negative width in a RuntimeError from torch, and a config asking for 1e12 parameters reached the allocator. Here
every key is checked against what the constructor takes (names, types, ranges, choices), the parameter count and
bytes are computed from the config alone in closed form (the same count the constructor's tensors have; a test
compares them for every kind), and each refusal names the file, the key and what is allowed.
"""

import inspect
import os
from typing import Any

import torch

DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_PARAMETERS = 2_000_000_000  # far above any translator the studies train (a GPT-2 -> Qwen2.5-0.5B one: ~10M)
MAX_BYTES = 8 * 2**30  # parameters and output statistics at the saved dtype
MAX_INT = 2**31 - 1  # a width or count above this is no translator
GEOMETRY_KEYS = ("layers", "kv_heads", "head_dim")
META_KEYS = ("model_type", "training", "dtype")  # what config.json records besides the constructor's arguments


def fail(path: str, key: str, what: str) -> None:
    raise ValueError(f"{path}: {key} {what}")


def positive_int(path: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INT:
        fail(path, key, f"must be a whole number in 1..{MAX_INT}, got {value!r}")
    return value


def check_segments(path: str, segments: Any, layers: Any) -> None:
    """source_geom.segments: the layer counts of the source models read side by side, summing to its layers."""
    if not isinstance(segments, list) or len(segments) < 2:
        fail(path, "source_geom.segments", f"must be a list of two or more layer counts, got {segments!r}")
    for i, n in enumerate(segments):
        positive_int(path, f"source_geom.segments[{i}]", n)
    if sum(segments) != layers:
        fail(path, "source_geom.segments", f"{segments} must sum to source_geom.layers={layers!r}")


def check_config(folder: str, config: dict[str, Any]) -> dict[str, Any]:
    """The constructor's arguments of config.json (read from `folder`), checked; raises ValueError naming the
    file and the key (unknown keys, missing keys, types, ranges, choices, and sizes over MAX_PARAMETERS /
    MAX_BYTES)."""
    from .translators import GATINGS, KINDS, TARGET_INPUTS, KVTranslator

    path = os.path.join(folder, "config.json")
    if not isinstance(config, dict):
        raise ValueError(f"{path}: must hold a JSON object, got {type(config).__name__}")
    signature = inspect.signature(KVTranslator.__init__).parameters
    allowed = [k for k in signature if k != "self"]
    for key in config:
        if key not in allowed and key not in META_KEYS:
            fail(path, repr(key), f"is not a translator setting (allowed: {', '.join(allowed + list(META_KEYS))})")
    required = [k for k in allowed if signature[k].default is inspect.Parameter.empty]
    missing = [k for k in required if k not in config]
    if missing:
        fail(path, "/".join(missing), f"missing (required: {', '.join(required)})")
    args = {k: config.get(k, signature[k].default) for k in allowed}
    for side in ("source_geom", "target_geom"):
        geom = args[side]
        if not isinstance(geom, dict) or any(k not in geom for k in GEOMETRY_KEYS):
            fail(path, side, f"must be an object with {', '.join(GEOMETRY_KEYS)}, got {geom!r}")
        for k, v in geom.items():
            if k == "segments" and side == "source_geom":
                check_segments(path, v, geom["layers"])
            else:
                positive_int(path, f"{side}.{k}", v)
    choices_of = {"kind": KINDS, "gating": GATINGS, "target_input": TARGET_INPUTS}
    for key in allowed:
        if key not in ("source_geom", "target_geom", *choices_of):
            positive_int(path, key, args[key])
    for key, choices in choices_of.items():
        if args[key] not in choices:
            fail(path, key, f"must be one of {', '.join(choices)}, got {args[key]!r}")
    dtype = config.get("dtype", "float32")
    if dtype not in DTYPE_NAMES:
        fail(path, "dtype", f"must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    params, buffers = parameter_count(args), buffer_count(args)
    size = (params + buffers) * DTYPE_NAMES[dtype].itemsize
    if params > MAX_PARAMETERS or size > MAX_BYTES:
        raise ValueError(
            f"{path}: the settings ask for {params:,} parameters ({size:,} bytes as {dtype}); at most "
            f"{MAX_PARAMETERS:,} parameters and {MAX_BYTES:,} bytes are built (check hidden, latent, n_experts, "
            "window, the geometries)"
        )
    return args


def parameter_count(args: dict[str, Any]) -> int:
    """Trainable parameters KVTranslator(**args) has, in closed form (no tensor is built; python ints do not
    overflow)."""
    from .translators import LATENT_KINDS, MIXTURE_KINDS

    src, tgt = args["source_geom"], args["target_geom"]
    L_s, L_t = src["layers"], tgt["layers"]
    src_dim, out_dim = 2 * src["kv_heads"] * src["head_dim"], 2 * tgt["kv_heads"] * tgt["head_dim"]
    E, embed_dim, hidden, latent = args["target_embed_dim"], args["embed_dim"], args["hidden"], args["latent"]
    M = args["n_experts"] if args["kind"] in MIXTURE_KINDS else 1
    count = 0
    if args["kind"] in LATENT_KINDS:
        enc_in = L_s * src_dim
        count += 2 * enc_in + enc_in * latent + latent + latent * latent + latent  # LayerNorm, Linear, Linear
        src_in = latent
    else:
        src_in = sum(min(args["k_layers"], n) for n in src.get("segments", [L_s])) * src_dim
    src_in *= args["src_window"]
    count += E * embed_dim if E > embed_dim else 0  # embed_proj
    emb_in = args["window"] * min(E, embed_dim)
    width = hidden + (M if args["kind"] in MIXTURE_KINDS else 0)
    count += 2 * src_in + 2 * emb_in  # the two LayerNorms
    count += L_t * src_in * width + emb_in * L_t * width + L_t * width  # w_src, w_emb, b_in
    count += L_t * hidden * M * hidden + L_t * M * hidden  # expert_up and its bias
    count += L_t * M * hidden * out_dim + L_t * M * out_dim  # expert_out and its bias
    return count


def buffer_count(args: dict[str, Any]) -> int:
    """Elements of the output statistics (out_mean, out_std)."""
    tgt = args["target_geom"]
    return 2 * tgt["layers"] * 2 * tgt["kv_heads"] * tgt["head_dim"]
