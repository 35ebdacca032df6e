"""Training a suite: ``run_suite`` plans, trains what is missing (``execute``: one `flwr run` per run, on one
or more lanes side by side) and writes the suite's tables; ``report_suite`` writes the tables of what has finished,
``park_suite`` readies a stopped suite's unfinished runs to be committed and continued elsewhere."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Callable

from experiments.runner.flower_env import process_identity
from experiments.runner.flower_runs import RunnerStopped
from experiments.runner.machine import machine_record
from experiments.runner.matching import match_sources_of, match_text
from experiments.runner.planning import PlannedRun, cell_suffix, federation_text, plan, settle_match
from experiments.runner.progress import Progress, duration
from experiments.runner.records import (
    COMPLETED,
    RUN_LOG,
    RUN_RECORD,
    RUNNING,
    make_summary_portable,
    portable_run_config,
    ran_to_the_end,
    read_record,
    recorded_git_state,
)
from experiments.runner.resume import (
    earlier_segments,
    move_aside,
    park_unfinished,
    refuse_links,
    resume_point,
    stop_left_running,
    suite_lock,
)
from experiments.runner.suite import Suite, load_suite
from experiments.runner.suite_folder import check_suite_folder, refuse_committed, suite_record
from fl_app.report import write_suite_tables
from fl_app.run.outputs import write_json


def note_in_flight(folder: Path, flower: dict) -> None:
    """Add to a running run's record what identifies its Flower run (``flower_env.in_flight``); the record written
    when the run ends drops it again."""
    record = read_record(folder) or {}
    write_json(folder / RUN_RECORD, {**record, "flower": flower})


def flower_launcher(
    env: dict, ray_cpus: int | None = None, stop: threading.Event | None = None
) -> Callable[[PlannedRun, float], str]:
    """The real launcher: one `flwr run` of the app per run (isolated Flower home in ``env``); the run's record
    names its Flower run while it trains (``stop_left_running``). ``ray_cpus``: the CPUs the run's own Ray may use
    (a lane's share of the cores; it caps how many clients train at once, not what they compute); unused when ``env``
    names a Ray cluster to join (RAY_ADDRESS: that cluster's CPUs are the cap, and Ray refuses num-cpus there).
    ``stop``: the suite's stop event; once set, the run in flight is stopped (``flwr_run``)."""
    from experiments.runner.flower_env import in_flight
    from experiments.runner.flower_runs import flwr_run

    ray_cpus = None if env.get("RAY_ADDRESS") else ray_cpus

    def launch(run: PlannedRun, timeout: float) -> str:
        federation = {**run.federation, **({"init-args-num-cpus": ray_cpus} if ray_cpus else {})}
        _, status = flwr_run(
            run.launch_config(),
            federation_text(federation),
            env=env,
            timeout=timeout,
            log_file=run.folder / RUN_LOG,
            started=lambda run_id: note_in_flight(run.folder, in_flight(env, run_id)),
            stop=stop,
        )
        return status

    return launch


PRIVATE_RAY, SHARED_RAY, CLUSTER_RAY = "own Ray per run", "one Ray head per lane", "the Ray cluster at RAY_ADDRESS"


def ray_kind(shared_ray: bool) -> str:
    """Where a suite's runs get Ray (recorded in run.json): a cluster named by RAY_ADDRESS in the environment wins."""
    if os.environ.get("RAY_ADDRESS"):
        return CLUSTER_RAY
    return SHARED_RAY if shared_ray else PRIVATE_RAY


def lane_launcher(
    stack: contextlib.ExitStack, ray_cpus: int | None, ray: str, printer, stop: threading.Event | None = None
) -> Callable:
    """A lane's launcher, its SuperLink (and, for ``SHARED_RAY``, its Ray head with the lane's share of the cores)
    kept by ``stack`` for the suite; ``stop`` as for ``flower_launcher``."""
    from experiments.runner.flower_env import local_flower_env
    from experiments.runner.ray_head import ray_head

    extra = {}
    if ray == SHARED_RAY:
        started = time.monotonic()
        head = stack.enter_context(ray_head(ray_cpus or os.cpu_count() or 1))
        printer(f"ray head {head.address} ({head.num_cpus} CPUs) started in {time.monotonic() - started:.1f} s")
        extra["RAY_ADDRESS"] = head.address
    return flower_launcher(stack.enter_context(local_flower_env(**extra)), ray_cpus, stop)


def execute(
    runs: list[PlannedRun],
    out: Path,
    launch: Callable[[PlannedRun, float], str] | list[Callable[[PlannedRun, float], str]] | None,
    run_timeout: float,
    printer=print,
    progress_every: float = 10.0,
    rerun_changed: bool = False,
    ray_cpus: int | None = None,
    ray: str | None = None,
    stop: threading.Event | None = None,
) -> list[PlannedRun]:
    """Train the runs marked 'train', printing a line as each starts, after each of its rounds (``Progress``, every
    ``progress_every`` seconds at most) and as it ends; returns failures. ``launch`` is one launcher, or a list of
    them: one lane each, the lanes training side by side (each takes the next run in order whose sources, for a
    match-compute run, have ended). Runs left running by a runner that died are stopped first; an interrupted run is
    moved aside and continues from its checkpoint. A pending match-compute run is resolved when it is reached (its
    sources, earlier in ``runs``, have ended); one that cannot run (a source failed, its folder holds a run of other
    settings) is a failure with its reason.

    Ctrl-C or SIGTERM (the runner's handler makes it a KeyboardInterrupt, which only the main thread receives) stops
    a suite of several lanes as it stops one lane: ``stop`` is set, each lane stops its run in flight (the launchers
    were given the same event) and takes no other, and the interrupt is raised once every lane has ended, so the
    lanes' SuperLinks (closed by the caller afterwards) are not taken from under runs still training. The records of
    the stopped runs stay as they were while they trained (``stop_left_running``, ``park`` read them), but for a run
    whose app had written its completed summary before the stop came: it is recorded as finished. ``stop`` set by
    another thread (no interrupt) ends the suite the same way, with ``RunnerStopped`` raised once every lane has
    ended: returning would count the stopped runs as neither failed nor unfinished."""
    launchers = launch if isinstance(launch, list) else [launch]
    stop = stop or threading.Event()
    commit, dirty = recorded_git_state()
    stop_left_running(runs, out, printer)
    state = {"to_train": sum(r.action in ("train", "pending") for r in runs), "trained": 0, "spent": 0.0}
    started, failed, taken, ended = time.time(), [], set(), set()
    turn = threading.Condition()

    def ready(run: PlannedRun) -> bool:
        return run.action != "pending" or all(id(source) in ended for source in match_sources_of(run, runs))

    def train_one(index: int, run: PlannedRun, launch: Callable[[PlannedRun, float], str]) -> None:
        where = f"[{index}/{len(runs)}] {run.label:<18} seed={run.seed} cell={cell_suffix(run.cell)[1:] or '-'}"
        with turn:  # settling a match reads its sources' files and may change the plan: one lane at a time
            if run.action == "pending":
                settle_match(run, runs, out, rerun_changed, failed)
                if run.action == "refuse":
                    run.action = "skip"
                    run.reason = (
                        f"{run.folder.relative_to(out)} holds a finished run with other settings: "
                        f"{'; '.join(run.differences)} (--rerun-changed trains it into a new folder)"
                    )
                if run.action == "train":
                    stop_left_running([run], out, printer)  # its folder is known only now
                else:
                    state["to_train"] -= 1
            if run.match_compute and run.action != "skip":
                printer(f"{where}  {match_text(run)}", flush=True)
            if run.action == "skip":
                printer(f"{where}  NOT RUN: {run.reason}", flush=True)
                failed.append(run)
                return
            if run.action == "reuse":
                printer(f"{where}  reuse {run.folder.relative_to(out)}", flush=True)
                return
        if run.folder.exists():
            run.moved_aside = move_aside(run.folder)
            printer(f"{where}  unfinished earlier run kept as {run.moved_aside.relative_to(out)}", flush=True)
        run.resume_from, run.resumed_after_round, skipped = resume_point(run, commit)
        for reason in skipped:
            printer(f"{where}  not continued from {reason}", flush=True)
        run.folder.mkdir(parents=True)
        record = {
            "label": run.label,
            "cell": run.cell,
            "seed": run.seed,
            "run_config": portable_run_config({**run.run_config, "output-dir": str(run.folder)}),
            "federation": run.federation,
            "data": run.data,
            "commit": commit,
            "dirty": dirty,
            "status": RUNNING,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "log": RUN_LOG,
            "machine": machine_record(len(launchers), ray_cpus, ray),
            **({"match_compute": run.match_compute} if run.match_compute else {}),
            **(
                {
                    "resumed_from": run.resume_from.name,
                    "resumed_after_round": run.resumed_after_round,
                    "earlier_segments": earlier_segments(run.resume_from, run.resumed_after_round),
                }
                if run.resume_from
                else {}
            ),
        }
        # who trains it, while it trains: a restarted runner tells a dead runner's record from a live one's
        write_json(run.folder / RUN_RECORD, {**record, "runner": process_identity(os.getpid())})
        resumed = (
            f", continuing {run.resume_from.name} after round {run.resumed_after_round}" if run.resume_from else ""
        )
        printer(f"{where}  start (log: {(run.folder / RUN_LOG).relative_to(out)}){resumed}", flush=True)
        t0 = time.time()

        # the runs after this one take the mean of those trained so far (none yet: this one's projected length),
        # spread over the lanes
        def later(run_seconds: float) -> float:
            left = state["to_train"] - state["trained"] - len(launchers)
            mean = state["spent"] / max(state["trained"], 1)
            return max(left, 0) * (mean or run_seconds) / len(launchers)

        def record_end(status: str) -> tuple[str, float]:
            elapsed = time.time() - t0
            if status == COMPLETED and not (run.folder / "summary.json").exists():
                status = "error: completed without summary.json"
            make_summary_portable(run.folder)
            machine = {**record["machine"], "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
            write_json(
                run.folder / RUN_RECORD,
                {**record, "machine": machine, "status": status, "elapsed_seconds": round(elapsed, 1)},
            )
            return status, elapsed

        try:
            with Progress(run, where, printer, later, progress_every):
                status = launch(run, run_timeout)
        except Exception as error:  # a run that cannot start or times out must not stop the rest of the suite
            status = f"error: {type(error).__name__}: {str(error)[-500:]}"
        except BaseException:  # the runner stopping: a run whose app had already ended is finished, not to retrain
            if ran_to_the_end(run.folder):
                _, elapsed = record_end(COMPLETED)
                printer(f"{where}  done in {duration(elapsed)}, just before the stop", flush=True)
            raise
        status, elapsed = record_end(status)
        with turn:
            state["trained"], state["spent"] = state["trained"] + 1, state["spent"] + elapsed
            if status != COMPLETED:
                failed.append(run)
            eta = state["spent"] / state["trained"] * (state["to_train"] - state["trained"]) / len(launchers)
            printer(
                f"{where}  {'done' if status == COMPLETED else 'FAILED ' + status} in {duration(elapsed)} "
                f"(suite {duration(time.time() - started)}, ETA {duration(eta)})",
                flush=True,
            )

    def lane(launch: Callable[[PlannedRun, float], str]) -> None:
        while True:
            with turn:
                while True:
                    waiting = [(i, r) for i, r in enumerate(runs, 1) if id(r) not in taken]
                    if not waiting or stop.is_set():
                        return
                    chosen = next(((i, r) for i, r in waiting if ready(r)), None)
                    if chosen is not None:
                        taken.add(id(chosen[1]))
                        break
                    turn.wait()
            try:
                train_one(*chosen, launch)
            except RunnerStopped:
                return
            finally:
                with turn:
                    ended.add(id(chosen[1]))
                    turn.notify_all()

    if len(launchers) == 1:
        lane(launchers[0])
    else:
        threads = [threading.Thread(target=lane, args=(f,), name=f"lane {k}") for k, f in enumerate(launchers)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:
            stop.set()
            with turn:
                turn.notify_all()  # a lane waiting for a matched run's sources
            printer("stopping: each lane stops its run in flight and takes no other", flush=True)
            for thread in threads:
                join_through_interrupts(thread)
            raise
    if stop.is_set():  # set by a caller's thread, not by an interrupt: the stopped runs are neither done nor failed
        raise RunnerStopped("the suite was stopped; the runs in flight were stopped")
    return sorted(failed, key=runs.index)


def join_through_interrupts(thread: threading.Thread) -> None:
    """Wait for ``thread`` to end; a further Ctrl-C or SIGTERM while waiting does not abandon it."""
    while thread.is_alive():
        with contextlib.suppress(KeyboardInterrupt):
            thread.join()


def lane_cpus(lanes: int, federation: dict, cores: int | None = None, machine: int | None = None) -> int | None:
    """The CPUs each lane's runs may give Ray so that lanes x parallel clients x threads stays within ``cores``, the
    cores the runner may use (unset: all the ``machine``'s, ``os.cpu_count``): None for one lane on every core (Ray
    sees every core, as a run started by hand does). Raises ValueError when ``cores`` is not 1 to the machine's, when
    there are more lanes than cores, or when the suite's clients each ask for more CPUs than a lane has (Ray would
    never schedule them)."""
    machine = machine or os.cpu_count() or 1
    if cores is not None and not 1 <= cores <= machine:
        raise ValueError(f"--cores {cores}: allowed 1 to {machine} (this machine's cores)")
    if lanes == 1 and cores in (None, machine):
        return None
    cores = cores or machine
    if lanes > cores:
        raise ValueError(f"lanes={lanes}: more runs side by side than the {cores} cores; allowed: 1 to {cores}")
    share = cores // lanes
    per_client = federation.get("client-resources-num-cpus", 2)  # Flower's default
    if per_client > share:
        raise ValueError(
            f"lanes={lanes}: each lane has {share} of the {cores} cores, but [federation] "
            f"client-resources-num-cpus={per_client}; allowed: at most {share} (or fewer lanes)"
        )
    return share


def run_suite(
    suite: Path | Suite,
    out: Path,
    rerun_changed: bool = False,
    allow_mixed_commits: bool = False,
    launch: Callable[[PlannedRun, float], str] | None = None,
    printer=print,
    plots: bool = True,
    into_committed: bool = False,
    progress_every: float = 10.0,
    lanes: int | None = None,
    shared_ray: bool = False,
    stop: threading.Event | None = None,
    cores: int | None = None,
) -> dict:
    """Plan (refusing mismatches before any training), train what is missing (``lanes`` runs side by side, else the
    suite's ``lanes``, sharing ``cores`` of the machine's, else all: ``lane_cpus``), write and print the tables. One
    runner at a time per OUT (``suite_lock``); a run folder reached through a link inside OUT is refused.
    ``shared_ray``: each lane's runs join one Ray head started for the suite (``ray_head``) instead of each starting
    and stopping its own Ray; a run's numbers are the same either way. ``stop``: once set (by ``execute`` on Ctrl-C
    or SIGTERM, or by a caller's thread), every lane stops its run in flight and starts no other; a ``launch`` given
    here must watch it as the real launcher does."""
    suite = suite if isinstance(suite, Suite) else load_suite(suite)
    lanes = lanes or suite.lanes
    ray_cpus = lane_cpus(lanes, suite.federation, cores)
    out = Path(out).resolve()
    refuse_committed(out, into_committed)
    with suite_lock(out):
        return _run_locked_suite(
            suite,
            out,
            rerun_changed,
            allow_mixed_commits,
            launch,
            printer,
            plots,
            progress_every,
            lanes,
            ray_cpus,
            shared_ray,
            stop or threading.Event(),
        )


def _run_locked_suite(
    suite: Suite,
    out: Path,
    rerun_changed: bool,
    allow_mixed_commits: bool,
    launch: Callable[[PlannedRun, float], str] | None,
    printer,
    plots: bool,
    progress_every: float,
    lanes: int,
    ray_cpus: int | None,
    shared_ray: bool,
    stop: threading.Event,
) -> dict:
    runs = plan(suite, out, rerun_changed)
    refuse_links(runs, out)
    check_suite_folder(suite, runs, out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "suite.json", suite_record(suite, runs, out), replace=True)  # check_suite_folder: this suite's
    pending = sum(r.action == "pending" for r in runs)
    printer(
        f"suite {suite.path.name}: {len(runs)} runs ({sum(r.action == 'train' for r in runs)} to train, "
        f"{sum(r.action == 'reuse' for r in runs)} finished earlier"
        + (f", {pending} matching the compute of runs that train first" if pending else "")
        + f") -> {out}",
        flush=True,
    )
    if launch is not None or not any(r.action in ("train", "pending") for r in runs):
        launchers = [launch] * lanes if launch is not None else None
        failed = execute(
            runs, out, launchers, suite.run_timeout, printer, progress_every, rerun_changed, ray_cpus, stop=stop
        )
    else:
        ray = ray_kind(shared_ray)
        ray_cpus = None if ray == CLUSTER_RAY else ray_cpus  # a cluster the user named has its own CPUs
        with contextlib.ExitStack() as stack:  # one SuperLink (own FLWR_HOME, free ports) per lane for the suite
            launchers = [lane_launcher(stack, ray_cpus, ray, printer, stop) for _ in range(lanes)]
            failed = execute(
                runs, out, launchers, suite.run_timeout, printer, progress_every, rerun_changed, ray_cpus, ray, stop
            )
    if pending:  # the folders of the matched runs are known only now (a .vK with --rerun-changed)
        write_json(out / "suite.json", suite_record(suite, runs, out), replace=True)
    finished = [r for r in runs if r not in failed]
    write_tables(suite, out, finished, allow_mixed_commits, plots, printer)
    not_run = [r for r in failed if r.action == "skip"]
    if not_run:
        printer("runs not run:\n  " + "\n  ".join(f"{r.name} seed={r.seed}: {r.reason}" for r in not_run), flush=True)
    if len(not_run) < len(failed):
        printer(
            "failed runs (moved aside, and continued from their last checkpoint or trained again, on the next "
            "invocation):\n  "
            + "\n  ".join(f"{r.folder.relative_to(out)} (log {RUN_LOG})" for r in failed if r not in not_run),
            flush=True,
        )
    return {"runs": runs, "failed": failed}


def write_tables(suite: Suite, out: Path, finished: list[PlannedRun], allow_mixed_commits: bool, plots: bool, printer):
    text = write_suite_tables(
        out,
        [r.folder for r in finished],
        reference=suite.reference,
        allow_mixed_commits=allow_mixed_commits,
        plots=plots,
    )
    printer(text, flush=True)


def report_suite(
    suite: Path | Suite,
    out: Path,
    allow_mixed_commits: bool = False,
    printer=print,
    plots: bool = True,
    into_committed: bool = False,
) -> dict:
    """Write OUT's tables from the suite's runs that have finished, training nothing, and list the rest: the tables
    of a suite that takes several sittings (a seed's runs finished, the next seed's not yet). The request is checked
    as ``run_suite`` checks it (no recorded run dropped, no finished run of other settings) and OUT/suite.json
    records it whole, so a later ``run`` of the same request trains what is missing."""
    with planned_suite_folder(suite, out, into_committed) as (suite, out, runs):
        check_suite_folder(suite, runs, out)
        finished = [r for r in runs if r.action == "reuse"]
        if not finished:
            raise ValueError(f"{out}: none of the suite's {len(runs)} runs has finished; nothing to report")
        write_json(out / "suite.json", suite_record(suite, runs, out), replace=True)
        write_tables(suite, out, finished, allow_mixed_commits, plots, printer)
        missing = [r for r in runs if r.action != "reuse"]
        if missing:
            printer(
                f"not in the tables: {len(missing)} of the {len(runs)} runs have not finished "
                "(`run` with the same request trains them):\n  "
                + "\n  ".join(f"{r.name} seed={r.seed}" + (f" ({r.reason})" if r.reason else "") for r in missing),
                flush=True,
            )
    return {"runs": runs, "finished": finished, "missing": missing}


def park_suite(suite: Path | Suite, out: Path, printer=print, into_committed: bool = False) -> list[Path]:
    """``park_unfinished`` for the runs of a request, once no runner writes OUT (``suite_lock``). Returns the parked
    checkpoints."""
    with planned_suite_folder(suite, out, into_committed) as (_, out, runs):
        return park_unfinished(runs, out, printer)


@contextlib.contextmanager
def planned_suite_folder(suite: Path | Suite, out: Path, into_committed: bool):
    """(suite, OUT resolved, the request's plan) while holding OUT's lock, for the commands that read a suite folder
    and train nothing (``report_suite``, ``park_suite``): refused when OUT is no folder (they create none), a
    committed one not asked for, or holds a link on the way to a run."""
    suite = suite if isinstance(suite, Suite) else load_suite(suite)
    out = Path(out).resolve()
    if not out.is_dir():
        raise ValueError(f"--out {out}: no such suite folder (a suite's runs are made there by `run`)")
    refuse_committed(out, into_committed)
    with suite_lock(out):
        runs = plan(suite, out)
        refuse_links(runs, out)
        yield suite, out, runs
