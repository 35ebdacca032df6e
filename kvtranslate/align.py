"""Token alignment between two tokenizers and layer mapping between two depths.

Token alignment: each target token reads the source token that covers its *last character* (character offsets
of both tokenizations of the same text). The last character is the one a causal model has just "seen" when it
writes that token's KV, so this picks the source state that has read at least as far as the target token.
"""

import bisect

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

Offsets = list[tuple[int, int]]  # (start, end) character span of each token


def char_offsets(tokenizer: PreTrainedTokenizerBase, text: str) -> tuple[list[int], Offsets]:
    """Token ids of `text` and the character span of each."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]


def align_offsets(source_offsets: Offsets, target_offsets: Offsets) -> list[int]:
    """For every target token, the index of the source token covering its last character.

    A character that no source token covers (e.g. trimmed whitespace) maps to the next source token that ends
    after it, and past the end to the last source token."""
    if not source_offsets:
        raise ValueError("source_offsets is empty: the source context has no tokens")
    source_ends = [end for _, end in source_offsets]
    index = []
    for start, end in target_offsets:
        last_char = max(start, end - 1)
        i = bisect.bisect_right(source_ends, last_char)  # first source token ending after last_char
        index.append(min(i, len(source_offsets) - 1))
    return index


def align_tokens(
    source_tokenizer: PreTrainedTokenizerBase, target_tokenizer: PreTrainedTokenizerBase, text: str
) -> tuple[list[int], list[int], list[int]]:
    """(source ids, target ids, target->source index) for one context string."""
    source_ids, source_offsets = char_offsets(source_tokenizer, text)
    target_ids, target_offsets = char_offsets(target_tokenizer, text)
    return source_ids, target_ids, align_offsets(source_offsets, target_offsets)


def layer_map(n_source: int, n_target: int, k: int = 2) -> list[list[int]]:
    """Each target layer reads the k source layers at the nearest relative depths (layer centres in [0, 1])."""
    if not 1 <= k <= n_source:
        raise ValueError(f"k (source layers per target layer) must be in 1..{n_source}, got {k}")
    source_depth = [(i + 0.5) / n_source for i in range(n_source)]
    mapping = []
    for j in range(n_target):
        depth = (j + 0.5) / n_target
        nearest = sorted(range(n_source), key=lambda i: (abs(source_depth[i] - depth), i))[:k]
        mapping.append(sorted(nearest))
    return mapping


def padded_alignment(
    alignments: list[list[int]], source_lengths: list[int], source_width: int, target_width: int
) -> Tensor:
    """Alignment indices for left-padded batches: [B, target_width] indices into the padded source axis."""
    index = torch.zeros(len(alignments), target_width, dtype=torch.long)
    for b, (a, n_src) in enumerate(zip(alignments, source_lengths)):
        if a:
            index[b, target_width - len(a) :] = torch.tensor(a) + (source_width - n_src)
    return index
