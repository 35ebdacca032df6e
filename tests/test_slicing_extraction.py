"""One slicing primitive: subnet shapes, extraction equal to the supernet's forward, standalone save/load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_app.models.elastic_resnet import ElasticResNet
from fl_app.models.supernet_space import Subnet
from fl_app.supernet.evaluation import extract_subnet, recalibrate_bn
from fl_app.supernet.slicing import prefix_region, slice_state, subnet_shapes


def test_prefix_region_selects_leading_block():
    t = np.arange(24).reshape(4, 6)
    assert t[prefix_region((2, 3))].tolist() == [[0, 1, 2], [6, 7, 8]]


def test_subnet_shapes_are_prefixes_of_supernet_shapes(cpu_cfg, cpu_cache):
    full = subnet_shapes(cpu_cfg, cpu_cfg.max_subnet())
    for entry in cpu_cache.entries:
        shapes = subnet_shapes(cpu_cfg, entry.arch)
        assert set(shapes) <= set(full)
        for name, shape in shapes.items():
            assert all(a <= b for a, b in zip(shape, full[name])), name


def _randomize_bn(model):
    gen = torch.Generator().manual_seed(0)
    for name, buf in model.named_buffers():
        if name.endswith("running_mean"):
            buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)
        elif name.endswith("running_var"):
            buf.copy_(torch.rand(buf.shape, generator=gen) + 0.5)


def test_extracted_subnet_equals_supernet_forward(cpu_cfg, cpu_cache):
    torch.manual_seed(0)
    supernet = ElasticResNet(cpu_cfg)
    _randomize_bn(supernet)
    state = supernet.state_dict()
    x = torch.randn(4, 3, 32, 32)
    supernet.eval()
    for entry in cpu_cache.entries[::3]:
        sub = extract_subnet(cpu_cfg, state, entry.arch).eval()
        with torch.no_grad():
            assert torch.allclose(sub(x), supernet(x, entry.arch), atol=1e-5)
        # the extracted model holds exactly the subnet's tensors, no more
        assert sum(p.numel() for p in sub.parameters()) == entry.params


def test_dynamic_bn_updates_only_the_active_prefix(cpu_cfg):
    small = Subnet((0, 0, 0, 0), (0.25,) * 4, (0, 0, 0, 0, 0))
    model = ElasticResNet(cpu_cfg)
    model.train()
    model(torch.randn(8, 3, 32, 32), small)
    c = cpu_cfg.stem_channels(small)
    mean = model.stem_bn.running_mean
    assert torch.count_nonzero(mean[:c]) == c
    assert torch.count_nonzero(mean[c:]) == 0


def test_recalibration_makes_bn_stats_exact_averages(cpu_cfg):
    arch = cpu_cfg.min_subnet()
    model = ElasticResNet(cpu_cfg, bounds=arch)
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    recalibrate_bn(model, images, batch_size=64)
    from fl_app.data.augment import normalize

    with torch.no_grad():
        stem = model.stem_conv(normalize(images), cpu_cfg.stem_channels(arch), cpu_cfg.stem_stride)
    assert torch.allclose(model.stem_bn.running_mean, stem.mean(dim=(0, 2, 3)), atol=1e-4)
    assert not model.training


def test_standalone_model_round_trip(tmp_path, cpu_cfg, cpu_cache):
    arch = cpu_cache.entries[5].arch
    model = extract_subnet(cpu_cfg, ElasticResNet(cpu_cfg).state_dict(), arch).eval()
    path = tmp_path / "subnet.pt"
    model.save_standalone(path)
    loaded = ElasticResNet.load_standalone(path).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))
    blob = torch.load(path, weights_only=True)  # plain torch reads it too
    assert set(blob) == {"supernet", "arch", "state_dict"}


def test_slice_state_rejects_non_prefix():
    import pytest

    with pytest.raises(ValueError, match="not a prefix"):
        slice_state({"w": np.zeros((2, 2))}, {"w": (3, 2)})


def test_population_weighted_accuracy_uses_the_largest_affordable_tier_or_the_best_on_validation():
    from fl_app.supernet.evaluation import population_weighted_accuracy

    budgets, macs = [1, 5, 10, 0.5], [1, 4, 9]
    test_acc, val_acc = [0.5, 0.3, 0.4], [0.6, 0.7, 0.2]
    # largest affordable: 0.5, 0.3, 0.4 and 0 for the client that affords nothing
    assert population_weighted_accuracy(budgets, macs, test_acc) == np.mean([0.5, 0.3, 0.4, 0.0])
    # best on validation: the 4-MAC tier wins wherever affordable (val 0.7), whatever its test accuracy
    assert population_weighted_accuracy(budgets, macs, test_acc, val_acc) == np.mean([0.5, 0.3, 0.3, 0.0])
    # choosing on test accuracy would have given 0.5 everywhere: not what either option reports
    assert population_weighted_accuracy(budgets, macs, test_acc, test_acc) == np.mean([0.5, 0.5, 0.5, 0.0])


def test_tier_evaluator_chooses_best_tier_on_validation_never_test(monkeypatch, cpu_cfg, cpu_cache):
    import pytest

    import fl_app.supernet.evaluation as evaluation
    from fl_app.data.images import ImageData

    tiers = cpu_cache.tiers(None, count=3)
    scores = {t.arch: acc for t, acc in zip(tiers, [(0.6, 0.5), (0.7, 0.3), (0.2, 0.9)])}  # (validation, test)
    monkeypatch.setattr(evaluation, "evaluate_subnet", lambda cfg, state, arch, calib, *splits: list(scores[arch]))
    data = ImageData(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.zeros(4, dtype=torch.long))
    budgets = [tiers[-1].macs] * 2
    results = {}
    for choice in ("largest", "best-validation"):
        evaluator = evaluation.TierEvaluator(
            cpu_cfg, tiers, budgets, data, data, data, 1, 1, lambda a: {}, population_tier=choice
        )
        evaluator(1, None)
        results[choice] = evaluator.last["population_weighted_accuracy"]
    assert results == {"largest": 0.9, "best-validation": 0.3}  # the test-best tier (0.9) is never chosen by test
    with pytest.raises(ValueError, match="population-tier"):
        evaluation.TierEvaluator(cpu_cfg, tiers, budgets, data, data, data, 1, 1, None, population_tier="best-test")


def test_client_subnet_accuracy_scores_each_client_with_its_own_largest_cached_subnet(monkeypatch, cpu_cfg):
    """A hand-made cache of four subnets, two of them reporting tiers: a client whose budget lies between the tiers is
    scored with its own largest affordable cached subnet (not the tier below it), each distinct subnet is
    recalibrated and scored once, and a subnet that is a tier reuses the tier's score."""
    import fl_app.supernet.evaluation as evaluation
    from fl_app.data.images import ImageData
    from fl_app.supernet.subnets import SubnetCache

    full = cpu_cfg.max_subnet()
    archs = [cpu_cfg.min_subnet(), *[Subnet(full.d, full.e, tuple(w // k for w in full.w)) for k in (4, 2)], full]
    cache = SubnetCache(cpu_cfg, archs)
    entries = cache.entries  # cheapest first
    tiers = [entries[0], entries[3]]
    test_accuracy = {e.arch: acc for e, acc in zip(entries, [0.10, 0.40, 0.55, 0.70])}
    calls = []

    def stand_in(cfg, state, arch, calibration, *splits):
        calls.append(arch)
        return [test_accuracy[arch]] * len(splits)

    monkeypatch.setattr(evaluation, "evaluate_subnet", stand_in)
    data = ImageData(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.zeros(4, dtype=torch.long))
    # budgets: exactly the smallest; between subnets 1 and 2 (twice); between 2 and 3; the whole supernet
    budgets = [entries[0].macs, entries[1].macs + 1, entries[1].macs + 1, entries[2].macs + 1, entries[3].macs]
    clients = [cache.local_max(b) for b in budgets]
    evaluator = evaluation.TierEvaluator(
        cpu_cfg,
        tiers,
        budgets,
        data,
        ImageData(data.images[:0], data.labels[:0]),
        data,
        1,
        1,
        lambda a: {},
        client_subnets=clients,
    )
    evaluator(1, None)
    assert evaluator.last["client_subnet_accuracy"] == pytest.approx(np.mean([0.10, 0.40, 0.40, 0.55, 0.70]))
    # the tier view scores the between-tier clients with the smallest tier
    assert evaluator.last["population_weighted_accuracy"] == pytest.approx(np.mean([0.10, 0.10, 0.10, 0.10, 0.70]))
    # the two tiers, then each distinct client subnet that is not a tier, once
    assert calls == [entries[0].arch, entries[3].arch, entries[1].arch, entries[2].arch]
    assert [row["accuracy"] for row in evaluator.last["client_subnets"]] == [0.10, 0.40, 0.40, 0.55, 0.70]
    assert {row["client_subnet_accuracy"] for row in evaluator.rows} == {evaluator.last["client_subnet_accuracy"]}

    without = evaluation.TierEvaluator(cpu_cfg, tiers, budgets, data, data, data, 1, 1, lambda a: {})
    without(1, None)  # methods whose clients run the tiers: the same score as the tier view
    assert without.last["client_subnet_accuracy"] == without.last["population_weighted_accuracy"]


def test_the_tier_evaluator_scores_tiers_as_the_strategy_declares(monkeypatch, cpu_cfg, cpu_cache):
    """The evaluator scores each tier through the method's ``TierScoring``: the state its ``tier_state`` gives, scored
    by its ``evaluate_tier``; every supernet-family strategy declares one, and FIARSE and ScaleFL their own."""
    import fl_app.supernet.evaluation as evaluation
    from fl_app.data.images import ImageData
    from fl_app.supernet_app import SUPERNET_METHOD_TABLE
    from strategies.fiarse import FiarseStrategy
    from strategies.scalefl import ScaleFLStrategy

    tiers = cpu_cache.tiers(None, count=2)

    class Scoring(evaluation.TierScoring):
        def tier_state(self, tier, state):
            return {"tier": tier.macs, **state}

        def evaluate_tier(self, cfg, state, arch, calibration, *splits):
            return [state["tier"] / 1e9] * len(splits)

    monkeypatch.setattr(evaluation, "evaluate_subnet", lambda *args: pytest.fail("the default scoring was used"))
    data = ImageData(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.zeros(4, dtype=torch.long))
    evaluator = evaluation.TierEvaluator(
        cpu_cfg, tiers, [tiers[-1].macs], data, data, data, 1, 1, lambda a: {"w": 1}, scoring=Scoring()
    )
    evaluator(1, None)
    assert [t["accuracy"] for t in evaluator.last["tiers"]] == [t.macs / 1e9 for t in tiers]
    assert all(issubclass(method.strategy, evaluation.TierScoring) for method in SUPERNET_METHOD_TABLE.values())
    assert FiarseStrategy.tier_state is not evaluation.TierScoring.tier_state
    assert ScaleFLStrategy.evaluate_tier is not evaluation.TierScoring.evaluate_tier


# -- post-hoc search and extraction -------------------------------------------------------------------------------
def _images(n, seed):
    from fl_app.data.images import ImageData

    g = torch.Generator().manual_seed(seed)
    return ImageData(
        torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


def test_search_respects_the_budget_and_explores_beyond_the_cache(cpu_cfg, cpu_cache):
    from fl_app.models.supernet_space import count_costs
    from fl_app.supernet.search import evolutionary_search, shrink_to_budget

    # a known objective: parameters (the search must climb it) — every candidate must still fit the budget
    def score(arch):
        return count_costs(cpu_cfg, arch)[1] / 1e6

    for budget in (count_costs(cpu_cfg, cpu_cfg.min_subnet())[0], 1.2e6, 3e6, 7e6):
        ranked = evolutionary_search(
            cpu_cfg, score, budget, population=6, generations=3, start=[c.arch for c in cpu_cache.under(budget)]
        )
        assert all(s.macs <= budget for s in ranked)
        assert ranked[0].val_accuracy == max(s.val_accuracy for s in ranked)
        assert [s.val_accuracy for s in ranked] == sorted((s.val_accuracy for s in ranked), reverse=True)
    cached = {c.arch for c in cpu_cache.entries}
    assert any(s.arch not in cached for s in ranked)  # new subnets, never used in federation
    rng = np.random.default_rng(0)
    assert count_costs(cpu_cfg, shrink_to_budget(cpu_cfg, cpu_cfg.max_subnet(), 1e6, rng))[0] <= 1e6
    import pytest

    with pytest.raises(ValueError, match="below the supernet's smallest subnet"):
        evolutionary_search(cpu_cfg, score, 1000)


def test_prefer_larger_takes_a_smaller_subnet_only_beyond_the_paired_sampling_error(cpu_cfg):
    """Three candidates scored on the same 10 validation examples (hand-made correctness vectors): the smallest is
    best by 0.1; the paired standard error of that difference decides whether the larger one is chosen."""
    from fl_app.supernet.search import Scored, ValidationScorer, prefer_larger

    full = cpu_cfg.max_subnet()
    archs = [cpu_cfg.min_subnet(), Subnet(full.d, full.e, tuple(w // 2 for w in full.w)), full]
    right = {  # small: 8/10, middle: 7/10 (differs from small on one example), large: 7/10 (differs on five)
        archs[0]: [1, 1, 1, 1, 1, 1, 1, 1, 0, 0],
        archs[1]: [1, 1, 1, 1, 1, 1, 1, 0, 0, 0],
        archs[2]: [0, 0, 1, 1, 1, 1, 1, 1, 1, 0],
    }
    scorer = ValidationScorer.__new__(ValidationScorer)  # scores from the hand-made vectors, no model
    scorer.validation, scorer.correct = [None] * 10, {a: np.array(v, dtype=bool) for a, v in right.items()}
    ranked = sorted(
        (Scored(a, macs, 0, scorer(a)) for a, macs in zip(archs, (1, 2, 3))), key=lambda s: (-s.val_accuracy, s.macs)
    )
    # paired differences small - middle: one +1 among ten -> mean 0.1, sd sqrt((1 - 10 * 0.01) / 9) = sqrt(0.1)
    se_middle = np.sqrt(0.1) / np.sqrt(10)
    assert scorer.paired_standard_error(archs[0], archs[1]) == pytest.approx(se_middle)
    # small - large: +1 twice, -1 once, zero seven times -> mean 0.1, sd sqrt((3 - 10 * 0.01) / 9)
    se_large = np.sqrt(2.9 / 9) / np.sqrt(10)
    assert scorer.paired_standard_error(archs[0], archs[2]) == pytest.approx(se_large)
    assert prefer_larger(ranked, scorer, 0.0).arch == archs[0]  # margin 0: the plain best on validation
    # margin 0.5: 0.1 > 0.5 * se_middle (0.05) and 0.1 > 0.5 * se_large (0.09): the smallest keeps its lead
    assert prefer_larger(ranked, scorer, 0.5).arch == archs[0]
    # margin 0.6: within 0.6 * se_large (0.108) but not 0.6 * se_middle (0.06): the largest
    assert prefer_larger(ranked, scorer, 0.6).arch == archs[2]
    assert prefer_larger(ranked, scorer, 2.0).arch == archs[2]


def _trained_checkpoint(tmp_path, cpu_cfg, monkeypatch):
    """A supernet.pt as a run writes it, and a dataset whose test split records when it is read."""
    import fl_app.extract as extract
    from fl_app.run.checkpoint import model_fingerprint, save_verified
    from fl_app.run.config import validate_run_config

    torch.manual_seed(0)
    state = {k: v for k, v in ElasticResNet(cpu_cfg).state_dict().items() if not k.endswith("num_batches_tracked")}
    run = validate_run_config({"val-size": 40, "calib-size": 40})
    path = save_verified(
        tmp_path / "supernet.pt",
        {"supernet": cpu_cfg.to_dict(), "state_dict": state, "run_config": run.to_dict()},
        model_fingerprint(run, cpu_cfg.to_dict()),
    )

    train, test = _images(200, 1), _images(60, 2)
    log = {"searching": False, "test_reads_while_choosing": 0, "test_reads": 0}

    class SpyTest(type(test)):
        def __getattribute__(self, name):
            if name in ("images", "labels"):
                log["test_reads"] += 1
                log["test_reads_while_choosing"] += log["searching"]
            return super().__getattribute__(name)

    spy = SpyTest(test.images, test.labels)
    monkeypatch.setattr(extract, "dataset_for", lambda run_, cfg_: (train, spy))
    original_choose = extract.choose

    def watched_choose(*args, **kwargs):
        log["searching"] = True
        try:
            return original_choose(*args, **kwargs)
        finally:
            log["searching"] = False

    monkeypatch.setattr(extract, "choose", watched_choose)
    return path, train, spy, log


def test_extract_searches_without_reading_test_data_and_the_standalone_model_reproduces_it(
    tmp_path, cpu_cfg, monkeypatch
):
    import fl_app.extract as extract
    from fl_app.supernet.evaluation import accuracy
    from fl_app.supernet.shared_setup import server_splits

    checkpoint, train, test, log = _trained_checkpoint(tmp_path, cpu_cfg, monkeypatch)
    out = tmp_path / "subnet.pt"
    result = extract.main(
        ["--checkpoint", str(checkpoint), "--macs", "2e6", "--out", str(out), "--population", "4", "--generations", "2"]
    )
    assert result["macs"] <= 2e6 and result["candidates"] >= 4
    assert log["test_reads_while_choosing"] == 0 and log["test_reads"] > 0  # test data read only after the choice
    model = ElasticResNet.load_standalone(out)
    splits = server_splits(extract.validate_run_config(torch.load(checkpoint)["run_config"]), train)
    assert accuracy(model, train.subset(splits.validation)) == result["val_accuracy"]
    assert accuracy(model, test) == result["accuracy"]
    assert Subnet.from_dict(result["arch"]) == model.bounds


def test_extract_from_cache_and_never_overwrites(tmp_path, cpu_cfg, cpu_cache, monkeypatch):
    import pytest

    import fl_app.extract as extract

    checkpoint, _, _, _ = _trained_checkpoint(tmp_path, cpu_cfg, monkeypatch)
    before = checkpoint.read_bytes()
    with pytest.raises(SystemExit):  # --out is the checkpoint itself
        extract.main(["--checkpoint", str(checkpoint), "--macs", "2e6", "--out", str(checkpoint)])
    existing = tmp_path / "kept.pt"
    existing.write_bytes(b"keep me")
    with pytest.raises(SystemExit):
        extract.main(["--checkpoint", str(checkpoint), "--macs", "2e6", "--out", str(existing), "--from-cache"])
    assert checkpoint.read_bytes() == before and existing.read_bytes() == b"keep me"
    result = extract.main(
        ["--checkpoint", str(checkpoint), "--macs", "2e6", "--out", str(tmp_path / "c.pt"), "--from-cache"]
    )
    assert result["source"] == "cache" and result["macs"] == cpu_cache.local_max(2e6).macs


def test_extract_refuses_a_damaged_verified_supernet(tmp_path, cpu_cfg):
    import pytest

    from fl_app.extract import load_trained
    from fl_app.run.checkpoint import save_verified
    from fl_app.run.config import validate_run_config

    state = {k: v for k, v in ElasticResNet(cpu_cfg).state_dict().items() if not k.endswith("num_batches_tracked")}
    path = save_verified(
        tmp_path / "supernet.pt",
        {"supernet": cpu_cfg.to_dict(), "state_dict": state, "run_config": validate_run_config({}).to_dict()},
        {"model": 1},
    )
    assert load_trained(path)[2] == cpu_cfg
    blob = torch.load(path, weights_only=True)
    blob["state_dict"]["stem_conv.weight"][0, 0, 0, 0] += 1.0  # altered after it was written
    torch.save(blob, path)
    with pytest.raises(ValueError, match="hash"):
        load_trained(path)


def _extract_from_cache(checkpoint, out):
    import fl_app.extract as extract

    return extract.main(["--checkpoint", str(checkpoint), "--macs", "2e6", "--out", str(out), "--from-cache"])


def _unverified(path, bad, cpu_cfg):
    blob = torch.load(path, weights_only=True)
    del blob["integrity"]
    torch.save(blob, bad)


def _damaged_record_key(path, bad, cpu_cfg):
    blob = torch.load(path, weights_only=True)
    blob["integrjty"] = blob.pop("integrity")  # one flipped letter in the record's key
    torch.save(blob, bad)


def _truncated(path, bad, cpu_cfg):
    bad.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _round_checkpoint(path, bad, cpu_cfg):
    from fl_app.run.checkpoint import load_verified, model_fingerprint, save_verified

    blob = load_verified(path)
    save_verified(
        bad,
        {"round": 2, "run_config": blob["run_config"], "num_clients": 3, "global_state": blob["state_dict"]},
        model_fingerprint(blob["run_config"], cpu_cfg.to_dict()),
    )


@pytest.mark.parametrize(
    "make_bad, reason",
    [
        (_unverified, "not a verified checkpoint"),
        (_damaged_record_key, "not a verified checkpoint"),
        (_truncated, "not a readable checkpoint"),
        (_round_checkpoint, "a round checkpoint"),
    ],
    ids=["unverified", "damaged-record-key", "truncated", "round-checkpoint"],
)
def test_extract_reads_only_a_verified_final_supernet(tmp_path, cpu_cfg, monkeypatch, capsys, make_bad, reason):
    checkpoint, _, _, _ = _trained_checkpoint(tmp_path, cpu_cfg, monkeypatch)
    bad, out = tmp_path / "bad.pt", tmp_path / "subnet.pt"
    make_bad(checkpoint, bad, cpu_cfg)
    with pytest.raises(SystemExit) as exit_:
        _extract_from_cache(bad, out)
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert f"--checkpoint {bad}: " in error and reason in error, error
    assert not out.exists()


def test_extract_never_consumes_its_checkpoint_nor_writes_through_a_symlink(tmp_path, cpu_cfg, monkeypatch):
    checkpoint, _, _, _ = _trained_checkpoint(tmp_path, cpu_cfg, monkeypatch)
    partial = checkpoint.rename(tmp_path / "supernet.pt.partial")  # --out's old temporary name
    before = partial.read_bytes()
    out = tmp_path / "supernet.pt"
    result = _extract_from_cache(partial, out)
    assert partial.read_bytes() == before
    assert ElasticResNet.load_standalone(out).bounds.to_dict() == result["arch"]

    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (tmp_path / "c.pt.partial").symlink_to(victim)
    _extract_from_cache(partial, tmp_path / "c.pt")
    assert victim.read_bytes() == b"keep me" and (tmp_path / "c.pt").is_file()
    assert not (tmp_path / "c.pt").is_symlink()

    (tmp_path / "linked.pt").symlink_to(tmp_path / "elsewhere.pt")  # a dangling link at --out
    with pytest.raises(SystemExit):
        _extract_from_cache(partial, tmp_path / "linked.pt")
    assert (tmp_path / "linked.pt").is_symlink() and not (tmp_path / "elsewhere.pt").exists()
    assert partial.read_bytes() == before
