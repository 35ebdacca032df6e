"""Small byte-level BPE tokenizers trained locally on the synthetic corpus (one per tiny model)."""

import os
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from .corpus import QAItem, tokenizer_training_text

EOS, PAD = "<|endoftext|>", "<|pad|>"


def train_tokenizer(vocab_size: int, seed: int = 0) -> PreTrainedTokenizerFast:
    """Byte-level BPE; different vocab sizes give different segmentations of the same text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_training_text(seed=seed), trainer=trainer)
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: str) -> None:
    tokenizer.backend_tokenizer.save(os.path.join(folder, "tokenizer.json"))


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """A folder written by `pretrain` holds a bare tokenizer.json plus kvtranslate.json: load it as a plain
    fast tokenizer (AutoTokenizer would follow the model config and build e.g. a Qwen2Tokenizer)."""
    meta = os.path.join(name_or_path, "kvtranslate.json")
    if os.path.isfile(meta):
        return wrap(Tokenizer.from_file(os.path.join(name_or_path, "tokenizer.json")))
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_item(tokenizer: PreTrainedTokenizerBase, item: QAItem) -> dict[str, Any]:
    """Context, question, answer(+EOS) and options(+EOS) token lists, each piece encoded on its own so the
    context tokens are identical whether the model reads the context alone or followed by a question."""
    eos = [tokenizer.eos_token_id]
    return dict(
        context=encode_text(tokenizer, item.passage),
        **encode_turn(tokenizer, item),
        options=[encode_text(tokenizer, o) + eos for o in item.options],
    )


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_turn(tokenizer: PreTrainedTokenizerBase, item: QAItem) -> dict[str, list[int]]:
    """Question and answer(+EOS) tokens of one question turn, without re-encoding the passage and options."""
    return dict(
        question=encode_text(tokenizer, item.question),
        answer=encode_text(tokenizer, item.answer) + [tokenizer.eos_token_id],
    )
