"""KV translators: source context KV (aligned to target tokens) -> target pre-RoPE K and V, per target layer.

Input of target layer j for target token t: the K and V of the source layers at the nearest relative depths
(align.layer_map, k of them) at the source token aligned to t, plus the target's own embedding lookup (token,
and position for learned-position families) of t and the `window` - 1 target tokens before it. The lookups are
table reads, not a prefill. They tell the translator which target sub-token it is writing when several share
one source token, and the local window lets it write what the target's own early layers mix in from the
preceding tokens (e.g. which name a value follows): without it a translated cache lost name-value binding
(experiments/results/kvtranslate/README.md, History).

Kinds:
- "mot": M expert MLPs per target layer mixed by a token-wise router (softmax, or top-k renormalised) with a
  Switch-style load-balancing term;
- "single": one MLP per target layer (C2C-like projector);
- "shared-latent": the source maps all its layers into one latent vector per token, and every target layer
  decodes its K/V from that latent (one encoder per source model, one decoder per target model);
- "mot-latent": the shared-latent encoder with mot's experts and router per target layer (the experts decode
  from the latent);
- "no-source": the control every kind must beat: shared-latent's architecture and parameter count with the source
  features replaced by zeros, so it writes the target cache from the target's own embedding window alone.
Several source models (a source geometry with `segments`, models.source_geometry) are read as one cache of their
layers side by side: each target layer reads k layers of every one of them (`segment_layer_map`), the latent kinds
encode all of them.
With `src_window` > 1 each target token also reads the source part (per-layer K/V, or the latent) of its
`src_window` - 1 predecessors, as the embedding window does for the target's lookups.
All target layers are computed in batched matrix products, which keeps the translator cheaper than a prefill.
"""

import json
import math
import os
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file
from safetensors.torch import save as save_tensors
from torch import Tensor
from transformers import PreTrainedModel

from .align import layer_map
from .cache import KV
from .config_check import DTYPE_NAMES, check_config
from .files import output_folder, write_file, write_json
from .models import family_of, positions_from_mask
from .routing import BALANCE_TERMS, switch_balance

KINDS = ("mot", "single", "shared-latent", "mot-latent", "no-source")
MIXTURE_KINDS = ("mot", "mot-latent")  # M experts and a router per target layer
LATENT_KINDS = ("shared-latent", "mot-latent", "no-source")  # one encoder of all source layers into a latent per token
NO_SOURCE_KINDS = ("no-source",)  # never read the source: its features are zeroed before the encoder
GATINGS = ("softmax", "topk")
# what the translator reads from the target side: its embedding lookups (token + learned position), or only the
# target's positions (a sinusoidal code of them, as wide as the embeddings), so that everything about the tokens
# must come from the source cache: the setting where translation needs the source (issue: the target's own
# embedding window rebuilt most of the cache without it)
TARGET_INPUTS = ("embeddings", "positions")
# a saved translator: a folder with these two files (as transformers saves a model)
CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"
MODEL_TYPE = "kvtranslate-translator"  # config.json's model_type


def segment_layer_map(segments: list[int], n_target: int, k: int) -> list[list[int]]:
    """Per target layer, the source layers it reads: the k nearest in relative depth (align.layer_map) of every
    source model, the models' layers numbered one after another as `segments` (their layer counts) lays them out.
    One source: layer_map(layers, n_target, k) (k capped at its depth)."""
    reads, offset = [[] for _ in range(n_target)], 0
    for n in segments:
        for j, chosen in enumerate(layer_map(n, n_target, min(k, n))):
            reads[j] += [offset + i for i in chosen]
        offset += n
    return reads


def segment_layers(segments: list[int], i: int) -> tuple[int, ...]:
    """The source-layer indices of source model `i` when the models' layers lie one after another (`segments`)."""
    if not 0 <= i < len(segments):
        raise ValueError(f"source index must be in 0..{len(segments) - 1}, got {i}")
    start = sum(segments[:i])
    return tuple(range(start, start + segments[i]))


def source_features(kv: KV) -> Tensor:
    """List of (K, V) [B, H, T, D] -> [B, T, layers, 2*H*D] (keys pre-RoPE)."""
    feats = [torch.cat([k, v], dim=1).transpose(1, 2).flatten(2) for k, v in kv]
    return torch.stack(feats, dim=2)


def target_embeddings(model: PreTrainedModel, ids: Tensor, mask: Tensor, window: int = 1) -> Tensor:
    """The target's input-embedding lookup (token + learned position where the family has one) of each token and
    its window - 1 predecessors, concatenated [B, T, window * E] (zeros before the first real token)."""
    family = family_of(model)
    positions = positions_from_mask(mask)
    if family == "gpt2":
        emb = model.transformer.wte(ids) + model.transformer.wpe(positions)
    elif family == "opt":
        dec = model.model.decoder
        emb = dec.embed_tokens(ids) + dec.embed_positions(mask, 0, positions)
    else:
        emb = model.model.embed_tokens(ids)
    return embedding_window(emb * mask[..., None].to(emb.dtype), window)


def position_features(mask: Tensor, width: int) -> Tensor:
    """[B, T] mask -> [B, T, width]: a sinusoidal code of each real token's position (zeros at padding); no token
    identity, for translators with target_input "positions"."""
    positions = positions_from_mask(mask).float()[..., None]  # [B, T, 1]
    freqs = torch.exp(-math.log(10000.0) * torch.arange(0, width, 2, device=mask.device).float() / width)
    code = torch.cat([torch.sin(positions * freqs), torch.cos(positions * freqs)], -1)[..., :width]
    return code * mask[..., None].float()


def embedding_window(emb: Tensor, window: int) -> Tensor:
    """[B, T, E] -> [B, T, window * E]: each token's vector, then its predecessors' (zeros before the first)."""
    return torch.cat([F.pad(emb[:, : emb.shape[1] - i], (0, 0, i, 0)) for i in range(window)], dim=-1)


class KVTranslator(nn.Module):
    """Per target layer: [source part | target embedding window] -> hidden (+ router logits) -> experts -> K/V.

    The input projection is split into its source part (different per target layer) and its embedding-window
    part, which is the same input for every target layer: it is multiplied once by all layers' weights instead of
    being copied per layer (at GPT-2 -> Qwen2.5-0.5B shapes the copies dominated the translation time). Target
    embeddings wider than `embed_dim` are first projected down (one shared, bias-free map, so padding stays zero)."""

    def __init__(
        self,
        source_geom: dict[str, int],
        target_geom: dict[str, int],
        target_embed_dim: int,
        kind: str = "mot",
        k_layers: int = 2,
        hidden: int = 128,
        n_experts: int = 4,
        gating: str = "softmax",
        top_k: int = 2,
        latent: int = 256,
        window: int = 1,
        embed_dim: int = 128,
        src_window: int = 1,
        target_input: str = "embeddings",
    ) -> None:
        super().__init__()
        if window < 1 or src_window < 1:
            raise ValueError(f"window and src_window must be >= 1, got window={window} src_window={src_window}")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if target_input not in TARGET_INPUTS:
            raise ValueError(f"target_input must be one of {TARGET_INPUTS}, got {target_input!r}")
        if gating not in GATINGS:
            raise ValueError(f"gating must be one of {GATINGS}, got {gating!r}")
        if kind in MIXTURE_KINDS and not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in 1..n_experts={n_experts}, got {top_k}")
        # every constructor argument: what config.json records and from_pretrained rebuilds the translator from
        self.config: dict[str, Any] = dict(
            source_geom=dict(source_geom),
            target_geom=dict(target_geom),
            target_embed_dim=target_embed_dim,
            kind=kind,
            k_layers=k_layers,
            hidden=hidden,
            n_experts=n_experts,
            gating=gating,
            top_k=top_k,
            latent=latent,
            window=window,
            embed_dim=embed_dim,
            src_window=src_window,
        )
        if target_input != "embeddings":  # recorded only when set: configs saved before it stay as they were
            self.config["target_input"] = target_input
        self.target_input = target_input
        self.kind, self.gating, self.top_k, self.window, self.src_window = kind, gating, top_k, window, src_window
        # evaluation ablation: every expert weighted 1/M (does the router's choice matter?); not saved
        self.uniform_gates = False
        # evaluation ablation: these source layers read as zeros (with several sources, `segment_layers` of one of
        # them: does the translator use that source?); not saved
        self.zeroed_layers: tuple[int, ...] = ()
        self.balance_term = "switch"  # routing.BALANCE_TERMS key the training loss reads as aux["balance"]
        self.n_experts = n_experts if kind in MIXTURE_KINDS else 1
        L_t, L_s = target_geom["layers"], source_geom["layers"]
        self.layers, self.hidden = L_t, hidden
        self.layer_map = segment_layer_map(source_geom.get("segments", [L_s]), L_t, k_layers)
        src_dim = 2 * source_geom["kv_heads"] * source_geom["head_dim"]
        self.kv_heads, self.head_dim = target_geom["kv_heads"], target_geom["head_dim"]
        out_dim = 2 * self.kv_heads * self.head_dim
        # output normalisation (set from data by `fit_output_stats`): the MLPs predict standardised K/V
        self.register_buffer("out_mean", torch.zeros(L_t, 1, out_dim))
        self.register_buffer("out_std", torch.ones(L_t, 1, out_dim))
        if kind in LATENT_KINDS:
            enc_in = L_s * src_dim
            self.encoder = nn.Sequential(
                nn.LayerNorm(enc_in), nn.Linear(enc_in, latent), nn.GELU(), nn.Linear(latent, latent)
            )
            src_in = latent
        else:
            src_in = len(self.layer_map[0]) * src_dim
        src_in *= src_window
        self.embed_proj = (
            nn.Linear(target_embed_dim, embed_dim, bias=False) if target_embed_dim > embed_dim else nn.Identity()
        )
        emb_in = window * min(target_embed_dim, embed_dim)
        M = self.n_experts
        self.router_out = M if kind in MIXTURE_KINDS else 0  # router logits ride along with the input projection
        width = hidden + self.router_out
        scale = 1 / math.sqrt(src_in + emb_in)
        self.src_norm, self.emb_norm = nn.LayerNorm(src_in), nn.LayerNorm(emb_in)
        self.w_src = nn.Parameter(torch.randn(L_t, src_in, width) * scale)
        self.w_emb = nn.Parameter(torch.randn(emb_in, L_t * width) * scale)
        self.b_in = nn.Parameter(torch.zeros(L_t, 1, width))
        # experts of one layer side by side: up [H, M*H], out [M*H, O] (gates scale each expert's block)
        self.expert_up = nn.Parameter(torch.randn(L_t, hidden, M * hidden) / math.sqrt(hidden))
        self.expert_up_bias = nn.Parameter(torch.zeros(L_t, 1, M * hidden))
        self.expert_out = nn.Parameter(torch.randn(L_t, M * hidden, out_dim) / math.sqrt(hidden))
        self.expert_out_bias = nn.Parameter(torch.zeros(L_t, M, out_dim))

    def route(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """Token-wise mixture weights [L, N, M] (sum to 1) from router logits."""
        probs = F.softmax(logits, dim=-1)
        if self.gating == "softmax":
            return probs, probs
        top = probs.topk(self.top_k, dim=-1)
        gates = torch.zeros_like(probs).scatter(-1, top.indices, top.values)
        return gates / gates.sum(-1, keepdim=True), probs

    def forward(self, src_feats: Tensor, tgt_embed: Tensor, mask: Tensor | None = None) -> tuple[KV, dict[str, Tensor]]:
        """src_feats [B, T, L_s, F_s] (already aligned to target tokens), tgt_embed [B, T, E] (the target's
        embedding lookups, one per token: the window is built here), mask [B, T].
        Returns target pre-RoPE kv (list of (K, V) [B, H_t, T, D_t]) and aux {"balance", "gates", "router_probs"}
        (the last two for mixture kinds; gates are the weights used, router_probs the router's softmax)."""
        B, T = tgt_embed.shape[:2]
        L, N, M, H = self.layers, B * T, self.n_experts, self.hidden
        if self.kind in NO_SOURCE_KINDS:
            src_feats = torch.zeros_like(src_feats)  # same shapes and budget, no information from the source
        elif self.zeroed_layers:
            src_feats = src_feats.clone()
            src_feats[:, :, list(self.zeroed_layers)] = 0
        if self.kind in LATENT_KINDS:
            z = self.source_window(self.encoder(src_feats.flatten(2)), mask).reshape(1, N, -1)  # [1, N, Z]
            a = torch.matmul(self.src_norm(z), self.w_src)  # [L, N, W]
        else:
            per_layer = torch.stack(
                [self.source_window(src_feats[:, :, idx].flatten(2), mask).reshape(N, -1) for idx in self.layer_map]
            )
            a = torch.bmm(self.src_norm(per_layer), self.w_src)  # [L, N, W]
        e = self.emb_norm(embedding_window(self.embed_proj(tgt_embed), self.window)).reshape(N, -1)
        a = a + (e @ self.w_emb).view(N, L, -1).transpose(0, 1) + self.b_in  # [L, N, W]
        h = F.gelu(a[..., :H])  # [L, N, H]
        u = F.gelu(torch.baddbmm(self.expert_up_bias, h, self.expert_up)).view(L, N, M, H) + h[:, :, None]
        aux = {"balance": torch.zeros((), device=h.device)}
        if self.router_out:
            gates, probs = self.route(a[..., H:])  # [L, N, M]
            aux["balance"] = BALANCE_TERMS[self.balance_term](probs, mask)
            aux["router_probs"] = probs
            if self.uniform_gates:
                gates = torch.full_like(gates, 1.0 / M)
            aux["gates"] = gates
            u = u * gates[..., None]
            bias = torch.bmm(gates, self.expert_out_bias)  # [L, N, O]
        else:
            bias = self.expert_out_bias
        y = torch.baddbmm(bias, u.reshape(L, N, M * H), self.expert_out)  # [L, N, O]
        y = y * self.out_std + self.out_mean
        y = y.view(L, B, T, 2, self.kv_heads, self.head_dim).permute(0, 3, 1, 4, 2, 5)
        return [(y[j, 0], y[j, 1]) for j in range(L)], aux

    def source_window(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """[B, T, F] -> [B, T, src_window * F] (padding zeroed first); unchanged at src_window 1."""
        if self.src_window == 1:
            return x
        if mask is not None:
            x = x * mask[..., None].to(x.dtype)
        return embedding_window(x, self.src_window)

    @torch.no_grad()
    def fit_output_stats(self, kv_list: list[KV], masks: list[Tensor]) -> None:
        """Per-channel mean/std of the target's native K/V over real tokens of a few batches."""
        rows = [[] for _ in range(self.layers)]
        for kv, mask in zip(kv_list, masks):
            for j, (k, v) in enumerate(kv):
                flat = torch.cat([k, v], 1).transpose(1, 2).flatten(2)  # [B, T, O]
                rows[j].append(flat[mask.bool()])
        for j in range(self.layers):
            data = torch.cat(rows[j])
            self.out_mean[j, 0] = data.mean(0)
            self.out_std[j, 0] = data.std(0).clamp(min=1e-3)

    def save_pretrained(self, folder: str, training: dict[str, Any] | None = None) -> None:
        """`folder`/config.json (the constructor's arguments, model_type, the weights' dtype, and `training`: the
        settings it was trained with) and `folder`/model.safetensors (every weight and buffer), written by
        files.write_file (never through a link; another run's files are kept)."""
        dtype = str(self.w_src.dtype).removeprefix("torch.")
        config = dict(model_type=MODEL_TYPE, **self.config, dtype=dtype, training=training or {})
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        output_folder(folder)
        write_json(os.path.join(folder, CONFIG_NAME), config)
        write_file(os.path.join(folder, WEIGHTS_NAME), save_tensors(state, metadata={"format": "pt"}))

    @classmethod
    def from_pretrained(
        cls, folder: str, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None
    ) -> "KVTranslator":
        """A translator saved by `save_pretrained`, in eval mode on `device`, in `dtype` (a torch dtype or its name;
        None: the dtype it was saved in, float32 for folders that recorded none); its training settings are in
        `.training_settings`. config.json is checked (config_check.py: keys, ranges, parameter count and bytes)
        before anything is built. (A folder of translator.pt from older versions loads with
        pipeline.load_translator.)"""
        config = read_config(folder)
        args = check_config(folder, config)
        saved = DTYPE_NAMES[config.get("dtype", "float32")]
        if dtype is None:
            dtype = saved
        elif isinstance(dtype, str):
            if dtype not in DTYPE_NAMES:
                raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)} or a torch dtype, got {dtype!r}")
            dtype = DTYPE_NAMES[dtype]
        translator = cls(**args).to(saved)
        translator.load_state_dict(load_file(os.path.join(folder, WEIGHTS_NAME)))
        translator.training_settings = config.get("training", {})
        return translator.to(device=device, dtype=dtype).eval()


def read_config(folder: str) -> dict[str, Any]:
    """config.json of a translator folder, checked to be one (an error naming the folder and the files it lacks)."""
    paths = [os.path.join(folder, name) for name in (CONFIG_NAME, WEIGHTS_NAME)]
    missing = [os.path.basename(p) for p in paths if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(
            f"translator folder {folder} has no {' / '.join(missing)} (it needs {CONFIG_NAME} and {WEIGHTS_NAME})"
        )
    with open(paths[0]) as f:
        config = json.load(f)
    if config.get("model_type") != MODEL_TYPE:
        raise ValueError(
            f"{paths[0]}: model_type is {config.get('model_type')!r}, not {MODEL_TYPE!r} (not a kvtranslate translator)"
        )
    return config


def balance_loss(probs: Tensor, mask: Tensor | None = None) -> Tensor:
    """Switch-Transformer load balancing (routing.switch_balance; kept under its old name)."""
    return switch_balance(probs, mask)
