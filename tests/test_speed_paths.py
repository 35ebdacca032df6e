"""The faster paths compute what the plain ones do: channels-last activations give the same logits and gradients
as the contiguous layout (up to float rounding); the foreach optimizer/clipping, whole tensors where a subnet uses all
of them and in-place activations give bit-identical training. The ClientApp and ServerApp load without
flwr-datasets (seconds of imports per process), and the γ-allocation it no longer needs gives the partitions its
flwr-datasets partitioner gives."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from clients import feast
from clients.feast import plan_subnets, train_subnets
from experiments.benchmarks.bench_train import random_images, step_settings
from fl_app.models import elastic_resnet
from fl_app.models.elastic_resnet import ElasticResNet, prefix


def _forward_backward(cfg, bounds, arch, x, memory_format):
    torch.manual_seed(0)
    model = ElasticResNet(cfg, bounds)
    model.memory_format = memory_format
    model.train()
    out = model(x, arch)
    out.square().sum().backward()
    return out.detach(), {k: p.grad for k, p in model.named_parameters()}, model.state_dict()


def test_channels_last_matches_contiguous_layout(cpu_cfg, cpu_cache):
    bounds = cpu_cache.route_bounds(5e6)
    arch = cpu_cache.under(5e6)[len(cpu_cache.under(5e6)) // 2].arch  # a subnet strictly inside the bounds
    x = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out_cl, grads_cl, state_cl = _forward_backward(cpu_cfg, bounds, arch, x, torch.channels_last)
    out_c, grads_c, state_c = _forward_backward(cpu_cfg, bounds, arch, x, torch.contiguous_format)
    assert torch.allclose(out_cl, out_c, rtol=1e-4, atol=1e-5)
    assert grads_cl.keys() == grads_c.keys()
    for name, grad in grads_c.items():
        if grad is None:  # a block outside the subnet: untouched in both layouts
            assert grads_cl[name] is None, name
            continue
        assert torch.allclose(grads_cl[name], grad, rtol=1e-3, atol=1e-5), name
        # the same elements (the subnet's prefix slice) receive gradient
        assert torch.equal(grads_cl[name] != 0, grad != 0), name
    for name, value in state_c.items():  # BN running statistics updated the same way
        assert torch.allclose(state_cl[name].float(), value.float(), rtol=1e-4, atol=1e-6), name
    # weights keep their NCHW layout: state dicts and payloads do not change
    assert all(t.is_contiguous() for t in state_cl.values())


def _trainer(cpu_cfg, cpu_cache):
    """A function that trains a fresh seeded model for three FEAST steps (max, min, random subnet) and returns its
    state: the max subnet uses whole tensors of the routed model, the others prefix slices."""
    data = random_images(24, cpu_cfg.n_classes, 32, seed=2)
    settings = step_settings(batch=8, steps=3)  # the benchmark's step: crop/flip, no Mixup/CutMix, KD 0.5
    budget = 1e6  # a routed model whose largest cached subnet is the whole of it
    bounds = cpu_cache.route_bounds(budget)
    plan = plan_subnets(cpu_cache, budget, bounds, ("max", "min", "random"))

    def trained():
        torch.manual_seed(0)
        model = ElasticResNet(cpu_cfg, bounds)
        train_subnets(model, plan, data, settings)
        return model.state_dict()

    assert plan.largest == bounds and plan.smallest is not None and plan.between
    return trained


def test_foreach_optimizer_and_clipping_are_bit_identical(cpu_cfg, cpu_cache, monkeypatch):
    """The client's own foreach SGD and foreach clipping train exactly as torch.optim.SGD and clipping one tensor at
    a time (three steps, so momentum buffers start, continue, and start late for tensors the first step missed)."""
    trained = _trainer(cpu_cfg, cpu_cache)
    fast = trained()
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(
        feast,
        "MomentumSGD",
        lambda params, lr, momentum, weight_decay: torch.optim.SGD(
            params, lr=lr, momentum=momentum, weight_decay=weight_decay, foreach=False
        ),
    )
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, foreach=None, **kw: clip(*a, foreach=False, **kw))
    plain = trained()
    assert all(torch.equal(fast[k], plain[k]) for k in fast)


def test_momentum_sgd_matches_torch_sgd_when_tensors_join_late():
    """Momentum buffers of tensors without a gradient in a step stay untouched, and a tensor's buffer starts at its
    first gradient, as in torch.optim.SGD (foreach and one tensor at a time)."""
    from clients.local_training import MomentumSGD

    def run(make):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
        optimizer = make(params)
        for step in range(4):
            for i, p in enumerate(params):  # tensor i trains from step i on; tensor 0 skips step 2
                p.grad = torch.randn(5, 3) if i <= step and (i, step) != (0, 2) else None
            optimizer.step()
        return [p.detach().clone() for p in params]

    ours = run(lambda ps: MomentumSGD(ps, 0.05, 0.9, 5e-4))
    for foreach in (True, False):
        reference = run(lambda ps, f=foreach: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=5e-4, foreach=f))
        assert all(torch.equal(a, b) for a, b in zip(ours, reference))


def test_whole_tensors_and_in_place_activations_train_bit_identically(cpu_cfg, cpu_cache, monkeypatch):
    weight = torch.zeros(8, 4, 3, 3)
    assert prefix(weight, 8, 4) is weight  # nothing cut: the tensor itself, no slice in the autograd graph
    assert prefix(weight, 8, 2).shape == (8, 2, 3, 3) and prefix(weight, 5).shape == (5, 4, 3, 3)
    trained = _trainer(cpu_cfg, cpu_cache)
    fast = trained()
    # the plain arithmetic: every tensor through a slice view, every activation out of place
    relu = torch.nn.functional.relu
    monkeypatch.setattr(elastic_resnet, "prefix", lambda t, *sizes: t[tuple(slice(0, n) for n in sizes)])
    monkeypatch.setattr(torch.nn.functional, "relu", lambda x, inplace=False: relu(x))
    plain = trained()
    assert fast.keys() == plain.keys()
    assert all(torch.equal(fast[k], plain[k]) for k in fast)


def test_apps_load_and_partition_without_flwr_datasets():
    """The default run's processes (the simulation's validation load, every client actor, the server) import the apps
    and draw the γ-allocated partitions without importing flwr-datasets or datasets (decoding the bundled sample the
    first time does import ``datasets``; later processes read the decoded cache)."""
    code = """
import sys
import numpy as np
import fl_app.client_app, fl_app.server_app
from fl_app.run.config import validate_run_config
from fl_app.supernet.shared_setup import SupernetSetup, pool_partitions
run = validate_run_config({})
assert run["partitioner"] == "gamma-class-size", run["partitioner"]
labels = np.random.default_rng(0).integers(0, 10, 5000)
parts = pool_partitions(run, labels, SupernetSetup.build(run, 8).budgets)
assert len(parts) == 8 and sum(len(p) for p in parts) == 5000 - run["val-size"] - run["calib-size"]
print(sorted(m for m in sys.modules if m.split(".")[0] in ("datasets", "flwr_datasets", "seaborn", "scipy")))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_gamma_partitioner_on_a_dataset_deals_the_allocations_partitions():
    """flwr-datasets' way (a Dataset, ``load_partition``) gives the rows that the app's own draw gives."""
    from datasets import Dataset

    from fl_app.data.gamma_partitioner import GammaPartitioner
    from fl_app.data.partition import GammaAllocation

    labels = np.random.default_rng(3).integers(0, 10, 2000)
    budgets = np.array([0.5, 0.5, 1.0, 2.6, 13.5]) * 1e6
    partitioner = GammaPartitioner(budgets, gamma=1.0, alpha=0.5, seed=4)
    partitioner.dataset = Dataset.from_dict({"label": labels, "row": np.arange(len(labels))})
    drawn = GammaAllocation(budgets, gamma=1.0, alpha=0.5, seed=4).draw(labels)
    assert partitioner.num_partitions == len(drawn) == 5
    for pid, rows in enumerate(drawn):
        assert np.asarray(partitioner.load_partition(pid)["row"]).tolist() == rows.tolist()
    assert sorted(np.concatenate(drawn).tolist()) == list(range(len(labels)))


def test_eval_inference_is_thread_count_independent_and_batches_side_by_side_agree(cpu_cfg, cpu_cache):
    """Tier evaluation runs its eval-mode batches side by side with one thread per op: eval-mode logits do not
    depend on the number of threads (unlike training-mode BatchNorm statistics, which recalibration therefore
    computes with the process's threads), and the side-by-side accuracy counts the same predictions."""
    from fl_app.data.augment import normalize
    from fl_app.data.images import ImageData
    from fl_app.supernet.evaluation import accuracy, extract_subnet, recalibrate_bn
    from fl_app.supernet.slicing import slice_subnet

    g = torch.Generator().manual_seed(5)
    tier = cpu_cache.tiers(None, count=3)[-1]
    torch.manual_seed(1)
    state = {k: v.numpy() for k, v in ElasticResNet(cpu_cfg).state_dict().items() if "num_batches" not in k}
    images = torch.randint(0, 256, (300, 3, 32, 32), dtype=torch.uint8, generator=g)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        model = extract_subnet(cpu_cfg, slice_subnet(cpu_cfg, state, tier.arch), tier.arch)
        recalibrate_bn(model, images[:200], batch_size=100)
        model.eval()
        logits = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.no_grad():
                logits[threads] = model(normalize(images))
        assert torch.equal(logits[1], logits[2])
        predicted = logits[2].argmax(1)
        labels = torch.where(torch.arange(300) % 3 == 0, (predicted + 1) % cpu_cfg.n_classes, predicted)
        assert accuracy(model, ImageData(images, labels), batch_size=100) == 200 / 300  # three batches, two workers
        assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(previous)


def test_plain_reference_is_the_subnet_as_a_dense_model(cpu_cfg, cpu_cache):
    """bench_train's eager reference computes exactly what the supernet computes for a subnet: its state has the
    subnet's names and shapes, and with the same weights its logits and gradients are bit-identical."""
    from experiments.benchmarks.bench_train import plain_resnet
    from fl_app.supernet.slicing import slice_subnet, subnet_shapes

    arch = cpu_cache.under(5e6)[len(cpu_cache.under(5e6)) // 2].arch
    torch.manual_seed(0)
    supernet = ElasticResNet(cpu_cfg)
    subnet = ElasticResNet(cpu_cfg, arch)  # the standalone subnet: the supernet's prefix slices of its weights
    subnet.load_state_dict({k: v.clone() for k, v in slice_subnet(cpu_cfg, supernet.state_dict(), arch).items()})
    torch.nn.init.normal_(subnet.stages[0][0].bn2.weight)  # zero-initialised: give its branch a gradient
    plain = plain_resnet(cpu_cfg, arch)
    plain.load_state_dict(subnet.state_dict())
    shapes = {k: tuple(v.shape) for k, v in plain.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert shapes == subnet_shapes(cpu_cfg, arch)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    out_subnet, out_plain = subnet(x), plain(x)
    assert torch.equal(out_subnet, out_plain)
    out_subnet.square().sum().backward()
    out_plain.square().sum().backward()
    for (name, p), q in zip(subnet.named_parameters(), plain.parameters()):
        assert torch.equal(p.grad, q.grad), name


def test_plain_subnets_train_each_drawn_subnet_in_its_own_model(cpu_cfg, cpu_cache):
    """The reference step trains the max, the min and the drawn in-between subnet, each in its own dense model."""
    from experiments.benchmarks.bench_train import plain_subnets

    budget = 1e6
    plan = plan_subnets(cpu_cache, budget, cpu_cache.route_bounds(budget), ("max", "min", "random"))
    torch.manual_seed(0)
    model = plain_subnets(cpu_cfg, plan)
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in model.models]
    train_subnets(model, plan, random_images(16, cpu_cfg.n_classes, 32, seed=2), step_settings(batch=8, steps=1))
    changed = [any(not torch.equal(v, m.state_dict()[k]) for k, v in b.items()) for m, b in zip(model.models, before)]
    assert changed[:2] == [True, True]  # max and min
    assert sum(changed[2:]) == 1  # one in-between subnet drawn for the one step


def test_crop_flip_crops_and_flips_each_sample_by_its_own_draw():
    from fl_app.data.augment import crop_flip

    images = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = crop_flip(images, torch.Generator().manual_seed(4), padding=2)
    draws = torch.Generator().manual_seed(4)  # the same draws, in crop_flip's order
    offsets = torch.randint(0, 5, (6, 2), generator=draws)
    flips = torch.rand(6, generator=draws) < 0.5
    padded = torch.zeros(6, 3, 12, 12, dtype=torch.uint8)
    padded[:, :, 2:10, 2:10] = images
    assert flips.any() and not flips.all()
    for i in range(6):
        y, x = int(offsets[i, 0]), int(offsets[i, 1])
        crop = padded[i, :, y : y + 8, x : x + 8]
        assert torch.equal(out[i], torch.flip(crop, dims=(2,)) if flips[i] else crop), i


def test_take_rows_equals_torch_indexing_for_every_index_form():
    """``take_rows`` (NumPy on the CPU) returns what ``tensor[indices]`` does, bit for bit, dtype and layout, for
    images, float batches and labels, for index lists, arrays and tensors, repeats and none; a tensor that needs a
    gradient keeps torch's indexing (and its graph)."""
    from fl_app.data.images import ImageData, take_rows

    g = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (50, 3, 8, 8), dtype=torch.uint8, generator=g)
    floats = torch.randn(50, 3, 8, 8, generator=g)
    labels = torch.randint(0, 10, (50,), generator=g)
    picks = [7, 0, 7, 49, 3]
    for tensor in (images, floats, labels):
        for form in (picks, np.array(picks), torch.tensor(picks), np.array(picks, dtype=np.int32), []):
            got = take_rows(tensor, form)
            want = tensor[torch.as_tensor(np.asarray(form), dtype=torch.long)]
            assert got.dtype == want.dtype and got.shape == want.shape and got.is_contiguous()
            assert torch.equal(got, want)
    data = ImageData(images, labels).subset(np.array([4, 1]))
    assert torch.equal(data.images, images[[4, 1]]) and data.labels.tolist() == labels[[4, 1]].tolist()
    weights = torch.randn(5, 2, requires_grad=True)
    take_rows(weights, [1, 1]).sum().backward()
    assert weights.grad[1].tolist() == [2.0, 2.0] and weights.grad[0].tolist() == [0.0, 0.0]
