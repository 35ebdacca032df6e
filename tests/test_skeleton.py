"""The round skeleton's contract: a strategy that leaves out a hook cannot be built (it would fail mid-round), and
the loop hands ``configure_evaluate`` the evaluate config, not the train config."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord

from strategies.skeleton import RoundSkeleton

HOOKS = ("train_content", "metric_specs", "reply_shapes", "merge")


def _strategy_class(missing: str | None = None, **methods):
    body = {name: (lambda self, *args: None) for name in HOOKS if name != missing}
    return type("Sketch", (RoundSkeleton,), {"summary": lambda self: None, **body, **methods})


@pytest.mark.parametrize("missing", HOOKS)
def test_a_strategy_without_a_hook_cannot_be_built(missing):
    with pytest.raises(TypeError, match=missing):
        _strategy_class(missing)({0: 10}, 1, clients_per_round=1, seed=0)


class _Grid:
    def send_and_receive(self, messages, timeout):
        return []


def test_configure_evaluate_receives_the_evaluate_config():
    seen = {}
    cls = _strategy_class(
        prepare_rounds=lambda self, timeout: None,
        configure_train=lambda self, server_round, arrays, config, grid: [],
        aggregate_train=lambda self, server_round, replies: (None, {}),
        configure_evaluate=lambda self, server_round, arrays, config, grid: seen.setdefault("config", config) and [],
    )
    strategy = cls({0: 10}, 1, clients_per_round=1, seed=0)
    train, evaluate = ConfigRecord({"lr": 0.1}), ConfigRecord({"what": "evaluate"})
    strategy.start(_Grid(), num_rounds=1, train_config=train, evaluate_config=evaluate)
    assert seen["config"] is evaluate


def test_every_method_strategy_implements_every_hook_and_a_supernet_one_needs_assign():
    from fl_app.multiarch_app import MULTIARCH_METHOD_TABLE
    from fl_app.supernet_app import SUPERNET_METHOD_TABLE
    from strategies.supernet_base import SupernetStrategy

    classes = {m.strategy for m in SUPERNET_METHOD_TABLE.values()} | {
        m.strategy for m in MULTIARCH_METHOD_TABLE.values()
    }
    assert len(classes) >= 12
    assert {cls.__name__: sorted(cls.__abstractmethods__) for cls in classes if cls.__abstractmethods__} == {}
    assert "assign" in SupernetStrategy.__abstractmethods__
