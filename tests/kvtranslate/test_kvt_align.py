import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from kvtranslate.align import align_offsets, align_tokens, layer_map


def word_tokenizer(words, split_digits):
    vocab = {w: i for i, w in enumerate(["[UNK]"] + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    steps = [pre_tokenizers.Whitespace()]
    if split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


WORDS = ["Napel", "is", "54", "5", "4", "."]


def test_alignment_hand_example_two_tokenizers():
    whole = word_tokenizer(WORDS, split_digits=False)  # Napel | is | 54 | .
    digits = word_tokenizer(WORDS, split_digits=True)  # Napel | is | 5 | 4 | .
    text = " Napel is 54."
    # target splits "54": both digits read the source token "54" (it covers their last characters)
    src, tgt, index = align_tokens(whole, digits, text)
    assert digits.convert_ids_to_tokens(tgt) == ["Napel", "is", "5", "4", "."]
    assert index == [0, 1, 2, 2, 3]
    # other direction: target "54" reads the source token covering "4", not the one covering "5"
    src, tgt, index = align_tokens(digits, whole, text)
    assert index == [0, 1, 3, 4]


def test_uncovered_character_maps_to_next_source_token():
    # source offsets skip the space at 5; a target token ending on it reads the next source token
    assert align_offsets([(0, 5), (6, 9)], [(0, 3), (3, 6), (6, 9)]) == [0, 1, 1]
    with pytest.raises(ValueError, match="source_offsets"):
        align_offsets([], [(0, 1)])


def test_layer_map_nearest_relative_depth():
    assert layer_map(2, 2, k=1) == [[0], [1]]
    assert layer_map(4, 2, k=2) == [[0, 1], [2, 3]]
    deep = layer_map(3, 6, k=1)
    assert deep[0] == [0] and deep[-1] == [2] and all(len(m) == 1 for m in deep)
    with pytest.raises(ValueError, match="k"):
        layer_map(2, 3, k=3)
