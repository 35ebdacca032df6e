"""Model zoo: tiny GPT-2 / OPT / Qwen2 built from configs, loading by name or path, and a position-aware forward.

Every forward goes through `forward()`, which derives position ids from the attention mask. That single rule
handles left padding (GPT-2 ignores the mask when it builds positions), OPT's mask-derived positions and
Qwen2's RoPE positions, and continuing from an injected cache.
"""

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    OPTConfig,
    OPTForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.pytorch_utils import Conv1D

from .tokenization import load_tokenizer, save_tokenizer, train_tokenizer

FAMILIES = ("gpt2", "opt", "qwen2")
LEARNED_POSITIONS = ("gpt2", "opt")  # Qwen2 rotates by position (RoPE), it has no position table
INITS = ("hf", "torch")
# The committed tiny checkpoints and their pretraining log are data, kept with kvtranslate's results outside this
# code-only package (a path in the repository, not an import)
RESULTS_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "results", "kvtranslate"
)
CHECKPOINT_DIR = os.path.join(RESULTS_DIR, "checkpoints")
N_POSITIONS = 256
# --dtype: "auto" loads a checkpoint in the dtype its config.json records (the tiny checkpoints: float32), as
# transformers' from_pretrained does; the others load it in that dtype
DTYPES = ("auto", "float32", "bfloat16", "float16")
# Eager attention rather than transformers' default (sdpa): every committed result was computed with it, and sdpa
# sums in another order (the tiny targets' cached keys differ by about 1e-6), so results would no longer be
# bit-identical. None lets transformers choose.
ATTN_IMPLEMENTATION = "eager"

# name -> family, tokenizer vocab size, tokenizer name (models may share one), architecture
TINY_SPECS = {
    "tiny-gpt2": dict(family="gpt2", vocab=512, tokenizer="tiny-gpt2", layers=2, hidden=128, heads=4, kv_heads=4),
    "tiny-opt": dict(family="opt", vocab=768, tokenizer="tiny-opt", layers=2, hidden=128, heads=4, kv_heads=4),
    "tiny-qwen2": dict(family="qwen2", vocab=1024, tokenizer="tiny-qwen2", layers=2, hidden=128, heads=4, kv_heads=2),
    # same family and tokenizer as tiny-qwen2, different depth and width (the same-family pair)
    "tiny-qwen2-b": dict(family="qwen2", vocab=1024, tokenizer="tiny-qwen2", layers=3, hidden=96, heads=4, kv_heads=2),
    # a source three times the target's depth: with k_layers = 1 most of its layers are read by no target layer, with
    # k_layers = 3 every one is
    "tiny-qwen2-deep": dict(
        family="qwen2", vocab=1024, tokenizer="tiny-qwen2", layers=6, hidden=96, heads=4, kv_heads=2
    ),
}


def tiny_config(
    spec: dict[str, Any], eos_id: int, pad_id: int, positions: int = N_POSITIONS, tie: bool = True
) -> PretrainedConfig:
    common = dict(
        vocab_size=spec["vocab"], bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id, tie_word_embeddings=tie
    )
    if spec["family"] == "gpt2":
        return GPT2Config(
            n_layer=spec["layers"],
            n_embd=spec["hidden"],
            n_head=spec["heads"],
            n_positions=positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    if spec["family"] == "opt":
        # word_embed_proj_dim must equal hidden_size; pad_token_id is OPT's embedding padding index
        return OPTConfig(
            num_hidden_layers=spec["layers"],
            hidden_size=spec["hidden"],
            num_attention_heads=spec["heads"],
            ffn_dim=4 * spec["hidden"],
            word_embed_proj_dim=spec["hidden"],
            max_position_embeddings=positions,
            dropout=0.0,
            attention_dropout=0.0,
            **common,
        )
    if spec["family"] == "qwen2":
        return Qwen2Config(
            num_hidden_layers=spec["layers"],
            hidden_size=spec["hidden"],
            num_attention_heads=spec["heads"],
            num_key_value_heads=spec["kv_heads"],
            intermediate_size=3 * spec["hidden"],
            max_position_embeddings=positions,
            rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
            **common,
        )
    raise ValueError(f"family must be one of {FAMILIES}, got {spec['family']!r}")


def build_tiny(
    name: str,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerBase | None = None,
    positions: int = N_POSITIONS,
    init: str = "torch",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Fresh (untrained) tiny model + its tokenizer. init="torch" (the committed checkpoints): see
    init_for_retrieval, with untied embeddings; init="hf": HF's N(0, 0.02) with tied input/output embeddings."""
    if name not in TINY_SPECS:
        raise ValueError(f"model name must be one of {sorted(TINY_SPECS)}, got {name!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    spec = TINY_SPECS[name]
    tokenizer = tokenizer or train_tokenizer(spec["vocab"])
    torch.manual_seed(seed)
    config = tiny_config(spec, tokenizer.eos_token_id, tokenizer.pad_token_id, positions, tie=init == "hf")
    cls = {"gpt2": GPT2LMHeadModel, "opt": OPTForCausalLM, "qwen2": Qwen2ForCausalLM}[spec["family"]]
    model = cls(config)
    if init == "torch":
        init_for_retrieval(model)
    return model.eval(), tokenizer


@torch.no_grad()
def init_for_retrieval(model: PreTrainedModel) -> None:
    """PyTorch's default scales instead of HF's N(0, 0.02): embeddings N(0, 1), every weight matrix
    U(+-1/sqrt(fan_in)). With HF's init and tied embeddings tiny-qwen2 did not learn to retrieve a value by
    matching content (an induction-style circuit) in 15,000 steps of a bare recall task; with this init,
    untied embeddings and lr 1e-3 it (and tiny-gpt2) learns it in 1,000-1,500
    (experiments/translation/probe_recall.py)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            torch.nn.init.normal_(module.weight)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, torch.nn.Linear):
            module.reset_parameters()
        elif isinstance(module, Conv1D):  # GPT-2's transposed linear: weight [in, out]
            bound = 1 / math.sqrt(module.weight.shape[0])
            torch.nn.init.uniform_(module.weight, -bound, bound)
            torch.nn.init.zeros_(module.bias)


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: str, meta: dict[str, Any]) -> None:
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    save_tokenizer(tokenizer, folder)
    with open(os.path.join(folder, "kvtranslate.json"), "w") as f:
        json.dump(meta, f, indent=1)


def resolve(name_or_path: str) -> str:
    """Tiny names map to the committed checkpoints; an existing folder is a local path; anything that looks like
    a path but does not exist is an error (no silent fall-back to a hub); the rest is a hub id."""
    if name_or_path in TINY_SPECS:
        folder = os.path.join(CHECKPOINT_DIR, name_or_path)
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"tiny checkpoint {folder} is missing: run `python -m kvtranslate pretrain "
                f"--models {name_or_path}` first"
            )
        return folder
    if os.path.isdir(name_or_path):
        return name_or_path
    looks_like_path = (
        name_or_path.startswith((".", "/", "~"))
        or name_or_path.count("/") > 1
        or os.path.isdir(os.path.dirname(name_or_path) or "\0")
    )
    if looks_like_path:
        raise FileNotFoundError(f"model path {name_or_path!r} does not exist")
    return name_or_path  # hub id such as "gpt2" or "Qwen/Qwen2.5-0.5B"


def check_dtype(dtype: str | torch.dtype) -> str | torch.dtype:
    """A --dtype name of DTYPES (or a torch.dtype), else an error naming the flag and the allowed values."""
    if isinstance(dtype, torch.dtype) or dtype in DTYPES:
        return dtype
    raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def load_model(
    name_or_path: str,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    attn_implementation: str | None = ATTN_IMPLEMENTATION,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A model (eval mode, on `device`) and its tokenizer by name or path (see `resolve`); `dtype` is one of DTYPES
    or a torch.dtype, passed to from_pretrained as its `dtype`."""
    dtype = check_dtype(dtype)
    where = resolve(name_or_path)
    config = AutoConfig.from_pretrained(where)
    family_of(config)  # before loading weights: an unsupported family fails with its name
    attention = {} if attn_implementation is None else dict(attn_implementation=attn_implementation)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **attention).eval()
    return model.to(device), load_tokenizer(where)


# "a+b" as a source: several source models that read the same context feed one target (their caches side by side)
SOURCE_SEPARATOR = "+"


@dataclass(frozen=True, eq=False)
class ModelPair:
    """The two sides of a translation: the source model that read the context (and its tokenizer) and the target
    model that answers from the translated cache (and its tokenizer). Every tensor the pipeline builds for a
    pair lives on the target's device. `more_sources`: further source models that read the same context with
    the same tokenizer (so one alignment serves them all); the translator reads all their caches."""

    source: PreTrainedModel
    source_tok: PreTrainedTokenizerBase
    target: PreTrainedModel
    target_tok: PreTrainedTokenizerBase
    more_sources: tuple[PreTrainedModel, ...] = ()

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def sources(self) -> tuple[PreTrainedModel, ...]:
        return (self.source, *self.more_sources)


def source_names(source: str) -> list[str]:
    """The source models a --source value names: one name or path, or several joined by SOURCE_SEPARATOR (a path
    that exists is one source even if it holds the separator)."""
    if os.path.exists(source) or SOURCE_SEPARATOR not in source:
        return [source]
    names = source.split(SOURCE_SEPARATOR)
    if any(not name for name in names):
        raise ValueError(
            f"source {source!r}: an empty name between {SOURCE_SEPARATOR!r} (write e.g. 'tiny-qwen2-b+tiny-qwen2-deep')"
        )
    return names


def load_pair(
    source: str,
    target: str,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "auto",
    attn_implementation: str | None = ATTN_IMPLEMENTATION,
) -> ModelPair:
    """Both sides of a pair by name or path (see `resolve`), on `device`, in `dtype` (see `load_model`). `source`
    may name several models joined by "+" (`source_names`): they must share one tokenizer and one KV head shape
    (`source_geometry`)."""
    load = dict(dtype=dtype, device=device, attn_implementation=attn_implementation)
    names = source_names(source)
    first, first_tok = load_model(names[0], **load)
    more = []
    for name in names[1:]:
        model, tokenizer = load_model(name, **load)
        if tokenizer.get_vocab() != first_tok.get_vocab():
            raise ValueError(
                f"source {source!r}: {name} and {names[0]} use different tokenizers; sources that feed one target "
                "together must share one (one alignment to the target's tokens)"
            )
        more.append(model)
    pair = ModelPair(first, first_tok, *load_model(target, **load), more_sources=tuple(more))
    source_geometry(pair)  # refuses sources whose KV heads differ
    return pair


def pick_device(name: str) -> torch.device:
    """ "cpu", "cuda" (an error naming --device when CUDA is absent) or "auto" (CUDA when present)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name} was requested but CUDA is not available here (use --device cpu or auto)")
    if not name.startswith(("cpu", "cuda")):
        raise ValueError(f"--device must be cpu, cuda[:N] or auto, got {name!r}")
    return torch.device(name)


def set_threads(n: int | None) -> None:
    """CPU threads for torch (--threads); None leaves torch's own choice."""
    if n is None:
        return
    if n < 1:
        raise ValueError(f"--threads must be >= 1, got {n}")
    torch.set_num_threads(n)


def family_of(model_or_config: PreTrainedModel | PretrainedConfig) -> str:
    config = getattr(model_or_config, "config", model_or_config)
    family = config.model_type
    if family not in FAMILIES:
        raise ValueError(
            f"unsupported model family {family!r} (model_type in the config): kvtranslate supports "
            f"{', '.join(FAMILIES)}"
        )
    return family


def kv_geometry(model: PreTrainedModel) -> dict[str, int]:
    """Layer count, KV heads and head width of the model's cache."""
    c, family = model.config, family_of(model)
    if family == "gpt2":
        return dict(
            layers=c.n_layer,
            heads=c.n_head,
            kv_heads=c.n_head,
            head_dim=c.n_embd // c.n_head,
            hidden=c.n_embd,
            max_positions=c.n_positions,
        )
    if family == "opt":
        return dict(
            layers=c.num_hidden_layers,
            heads=c.num_attention_heads,
            kv_heads=c.num_attention_heads,
            head_dim=c.hidden_size // c.num_attention_heads,
            hidden=c.hidden_size,
            max_positions=c.max_position_embeddings,
        )
    # Qwen2Config has no head_dim attribute
    return dict(
        layers=c.num_hidden_layers,
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        head_dim=c.hidden_size // c.num_attention_heads,
        hidden=c.hidden_size,
        max_positions=c.max_position_embeddings,
    )


def source_geometry(pair: ModelPair) -> dict[str, Any]:
    """The KV geometry of what the translator reads: the source's (`kv_geometry`), or for several sources their
    caches side by side: layers summed, `segments` the layer count of each, in order. Their KV heads and head
    width must agree (each layer's features are one row of the same width), else an error naming both."""
    geometries = [kv_geometry(model) for model in pair.sources]
    if len(geometries) == 1:
        return geometries[0]
    first = geometries[0]
    for model, geometry in zip(pair.sources[1:], geometries[1:]):
        for key in ("kv_heads", "head_dim"):
            if geometry[key] != first[key]:
                raise ValueError(
                    f"sources {pair.source.name_or_path} and {model.name_or_path}: {key} {first[key]} vs "
                    f"{geometry[key]}; sources that feed one target together need the same KV heads and head width"
                )
    return {**first, "layers": sum(g["layers"] for g in geometries), "segments": [g["layers"] for g in geometries]}


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position of each token = number of real tokens before it (pads get 0, they are masked anyway)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def forward(
    model: PreTrainedModel,
    ids: torch.Tensor,
    mask: torch.Tensor,
    cache: DynamicCache | None = None,
    past_mask: torch.Tensor | None = None,
    hidden_states: bool = False,
    use_cache: bool = True,
) -> CausalLMOutputWithPast:
    """Run `model` on ids [B, T] continuing `cache` (whose real/pad layout is `past_mask` [B, P])."""
    full_mask = mask if past_mask is None else torch.cat([past_mask, mask], dim=1)
    positions = positions_from_mask(full_mask)[:, -ids.shape[1] :]
    if family_of(model) in LEARNED_POSITIONS and positions.numel():
        limit = kv_geometry(model)["max_positions"]
        if int(positions.max()) >= limit:  # a learned position table has no row for it (an index error deep inside)
            raise ValueError(
                f"{int(positions.max()) + 1} tokens (cache + input) exceed the {limit} positions of this "
                f"{family_of(model)} model (max_position_embeddings / n_positions in its config)"
            )
    return model(
        input_ids=ids,
        attention_mask=full_mask,
        position_ids=positions,
        cache=cache,
        use_cache=use_cache,
        output_hidden_states=hidden_states,
    )
