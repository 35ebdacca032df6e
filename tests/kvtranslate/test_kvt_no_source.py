"""The no-source control: shared-latent's architecture and budget, blind to the source cache."""

import pytest
import torch

from kvtranslate.sizing import translator_parameters
from kvtranslate.translators import KVTranslator

SRC = dict(layers=3, kv_heads=4, head_dim=8)
TGT = dict(layers=2, kv_heads=2, head_dim=8)


def outputs(kind: str, feats: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    tr = KVTranslator(SRC, TGT, 16, kind=kind, hidden=16, latent=16, window=2).eval()
    with torch.no_grad():
        kv, _ = tr(feats, emb, torch.ones(feats.shape[:2]))
    return torch.stack([torch.cat([k, v]) for k, v in kv])


@pytest.mark.parametrize("kind,reads_source", [("no-source", False), ("shared-latent", True), ("mot", True)])
def test_output_changes_with_the_source_only_for_source_reading_kinds(kind, reads_source):
    torch.manual_seed(1)
    feats, emb = torch.randn(2, 5, SRC["layers"], 64), torch.randn(2, 5, 16)
    other = torch.randn_like(feats) * 3
    changed = not torch.equal(outputs(kind, feats, emb), outputs(kind, other, emb))
    assert changed == reads_source
    # every kind reads the target's embedding window
    assert not torch.equal(outputs(kind, feats, emb), outputs(kind, feats, emb + 1))


def test_no_source_has_shared_latent_parameter_count():
    settings = dict(hidden=24, latent=40)
    blind = translator_parameters(SRC, TGT, 16, {**settings, "kind": "no-source"})
    assert blind == translator_parameters(SRC, TGT, 16, {**settings, "kind": "shared-latent"})
