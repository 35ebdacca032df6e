"""Run a suite of experiments: every (method, grid cell, seed) of a suite file is one `flwr run` of the app.

    python -m experiments.runner run experiments/suites/smoke.toml --out /tmp/smoke
    python -m experiments.runner plan experiments/suites/smoke.toml --out /tmp/smoke     # what would run, no training
    python -m experiments.runner verify experiments/suites/smoke.toml --committed /tmp/smoke --out /tmp/smoke-again \
        --seeds 0 --methods feast       # retrain some runs into a new folder and compare their numbers
    python -m experiments.runner compare COMMITTED NEW    # the same comparison, for run folders made by other tools
    python -m experiments.runner report experiments/suites/smoke.toml --out /tmp/smoke   # tables of what has finished
    python -m experiments.runner park experiments/suites/smoke.toml --out /tmp/smoke     # stopped runs, to commit

A suite file (``experiments/suites/*.toml``)::

    [suite]
    seeds = [0, 1]
    reference = "feast"          # label the paired differences are taken against
    run-timeout = 3600           # seconds per run
    base-file = "experiments/conf/fedtopo-cifar10.toml"   # optional run config under [base] (its seed is ignored)
    [base]                       # run config of every run (fl_app.run.config keys); a relative data-path is read
    num-server-rounds = 2        #   from the repository root
    [federation]                 # simulation settings (--federation-config)
    num-supernodes = 4
    client-resources-num-cpus = 1
    [methods]                    # label -> run-config overrides; the label is the method unless it sets `method`
    feast = {}
    feast-kd0 = { method = "feast", kd-ratio = 0.0 }
    fedavg-min = {}
    fedavg-min-matched = { method = "fedavg-min", match-compute = "feast" }   # see below
    [grid]                       # optional: every combination of these values is one cell
    gamma = [0.0, 1.0]

A [methods] entry with the runner-only key ``match-compute = "<label>"`` trains, per seed and cell, as many rounds
as make its total client training FLOPs equal that label's finished run: num-server-rounds = ceil(T / f), T the
reference's total ``client_train_flops`` (its rounds.csv), f the mean per round of the same method's equal-rounds
run (the label whose overrides are the entry's without ``match-compute``, here ``fedavg-min``); its learning-rate
schedule spans its own rounds, and its eval-every is scaled so it evaluates about as often as that run. Its rounds
are known only once both runs of its seed have finished: it runs after them (matched entries come last within each
seed) and is not run, with the reason, when one failed. Its run.json records what the rounds came from
(``match_compute``); the report adds the matched-compute table (``matched.csv``). Beside it, ``match-flops =
"executed"`` matches the executed FLOPs instead of the counted ones (``client_train_flops_dense`` where a run counts
them apart: FIARSE computes its masked model densely, and the FEAST repository matches FIARSE on that; the default
``"counted"`` matches FIARSE's kept MACs).

Each run lives in ``OUT/runs/<label>[@cell]/seed<N>/``: the app's own outputs, ``run.log`` (the live `flwr run`
output) and ``run.json`` (full run config, federation, seed, data, commit, modified-tree flag, status, elapsed time).
Records hold no path of the machine that made them: ``data-path`` is kept relative to the repository (the suites'
``../shared/data/cifar10``) and the data by content (``data``: SHA-256 of the files read); ``output-dir`` is ``.``,
the folder of the record itself. A finished run is reused only when its run config, federation, seed and data
content equal the request, wherever the checkout and the data lie; any other finished run in the way is refused with
the differing keys named, before anything trains (``--rerun-changed`` trains the changed runs into new folders
``seed<N>.v2``, ... and keeps the old ones).

A stopped suite resumes where it stopped. An interrupted or failed run is moved aside (``seed<N>.interrupted-K``,
kept) and continues in a fresh ``seed<N>/`` from the latest checkpoint (``checkpoint-every``) among its moved-aside
copies made with the same settings at the same commit (``resume-from``; the app checks the checkpoint again and
refuses one of other settings); with none, it trains from round 1. The continued folder ends with the same
metrics.csv, summary and weights as an uninterrupted run, so the tables and the reuse rule treat it as one; its
run.json names the copy (``resumed_from``, ``resumed_after_round``) and, oldest first, the segments its kept
rounds were trained in (``earlier_segments``: rounds, commit, machine), so a run continued on another machine says
which processor trained which rounds. While a run trains its run.json names the
runner (pid, start time) and its Flower run (run id, FLWR_HOME, ports, SuperLink pids): a runner killed hard
(SIGKILL, out of memory) leaves a detached SuperLink still training, and the next invocation stops it before
anything trains (or refuses while that runner is alive). The console shows each run's rounds as they end (the last
evaluation's accuracy, the ETAs of the run and of the suite, from rounds.csv and metrics.csv). At the end the
suite's tables (means with 95% t-intervals over seeds, paired differences against the reference) are written by
``fl_app.report`` into OUT and printed. A suite that takes several sittings gets its tables so far from ``report``
(the finished runs of the request; the rest listed, nothing trained). A suite stopped on one machine continues on
another from committed files: ``park`` moves each unfinished run with a checkpoint aside (``seed<N>.interrupted-K``,
as the next ``run`` would), drops from its record what named this machine's processes, and prints the ``git add -f``
line for the checkpoints (which the results' .gitignore leaves out); ``run`` on the other machine, at the same
commit, continues them.

Cores and Ray: ``--lanes N`` (or ``[suite] lanes``) trains N runs side by side, each lane's Ray given its share of the
cores so that runs x parallel clients x threads stays within them. Each run's simulation starts and stops a Ray of
its own, as `flwr run .` by hand does; ``--shared-ray`` (a few seconds less a run: ``bench_overhead``) starts one
Ray head per lane for the whole suite (``ray_head``, with the lane's CPUs) that the lane's runs join, and with
RAY_ADDRESS in the environment every run joins that cluster and the runner starts none. run.json's ``machine``
records lanes, CPUs and which Ray (``ray``); none of it is part of a run's identity, and a run's numbers are the
same on each.

OUT belongs to one suite (``OUT/suite.json``): a request that would drop runs recorded there (a subset of its
methods or seeds, another suite) is refused, since its tables would be rewritten without them; adding seeds,
methods or grid values is allowed. One runner at a time writes OUT (it holds ``OUT/.runner.lock``; a second
is refused before it reads or moves anything); labels are folder names (letters, digits, ``. _ + -``), and a link
inside OUT on the way to a run folder is refused, never followed. The committed ``experiments/results/`` folders
are refused unless ``--into-committed`` says that updating them is the point.
"""

from __future__ import annotations

import importlib

# each public name -> the module of this package it lives in. Loaded on first use (PEP 562), so importing one module
# of the package (flower_env, machine) does not load the rest (fl_app.report, pandas). A test that patches a name
# patches it in the module that looks it up (e.g. experiments.runner.records.ROOT), not here.
HOMES = {
    "records": "ROOT DEFAULT_DATA RUN_RECORD RUN_LOG COMPLETED RUNNING data_location portable_data_path data_record "
    "portable_run_config portable_record_config make_summary_portable read_record is_finished recorded_git_state",
    "suite": "Suite SuiteMismatch load_suite match_sources",
    "planning": "PlannedRun expand decide plan settle_match",
    "matching": "flops_per_round matched_rounds resolve_match",
    "suite_folder": "RESULTS check_suite_folder is_committed",
    "resume": "CHECKPOINT LOCK_FILE SuiteBusy checkpoint_round resume_point suite_lock park_unfinished "
    "make_checkpoint_portable",
    "execution": "execute lane_cpus run_suite report_suite park_suite",
    "comparison": "MEASURED compare_run compare_folders",
    "verification": "verify",
    "cli": "SUITES main build_parser suite_parser run_named_suite add_run_config_option run_config_of",
}
MODULE_OF = {name: module for module, names in HOMES.items() for name in names.split()}
__all__ = sorted(MODULE_OF)


def __getattr__(name: str):
    module = MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
