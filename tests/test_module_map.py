"""docs/modules.md names every module with its docstring's first sentence, and is what the tool writes."""

from __future__ import annotations

from experiments.tools import module_map


def test_first_sentence_stops_at_a_full_stop_followed_by_a_space():
    assert module_map.first_sentence("Sparse average. Each element e.g. 1.5x over\\n clients.") == "Sparse average."
    assert module_map.first_sentence("a | b") == "a \\| b"
    assert module_map.first_sentence(None) == "(no docstring)"


def test_every_module_has_a_docstring_and_the_committed_map_is_current():
    text = module_map.map_text()
    for path in module_map.modules():
        if path.name != "__init__.py":
            assert f"| `{path.name}` |" in text, path
    assert "(no docstring)" not in text
    assert module_map.main(["--check"]) == 0
