"""Fan independent jobs out on joblib: local processes by default, a Dask cluster on request.

Cross-validation folds, the stopping backtest and the benchmarks are lists of
independent jobs (fit a fold, replay a run). :func:`map_jobs` runs them through
`joblib <https://joblib.readthedocs.io>`_: on local worker processes (the loky
backend) by default, or on a `Dask distributed
<https://distributed.dask.org>`_ cluster when ``cluster`` is given, through
``joblib.parallel_config(backend="dask")``. The same code then scales from a
laptop to many machines; nothing here is a hand-made pool.

Results come back in input order whatever the order of completion, so a
parallel run with fixed seeds gives exactly the serial result.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import joblib

from bayes_grpo.errors import BayesGrpoError

T = TypeVar("T")
R = TypeVar("R")

#: ``cluster="local:N"`` starts a throw-away Dask ``LocalCluster`` of N worker processes.
LOCAL_CLUSTER_PREFIX = "local:"


def describe(item: Any) -> str:
    """A short name for a job's item: its ``run_id`` or ``name`` attribute, else a truncated ``repr``."""
    for attribute in ("run_id", "name"):
        value = getattr(item, attribute, None)
        if isinstance(value, str):
            return value
    text = repr(item)
    return text if len(text) <= 80 else text[:77] + "..."


def _run_one(func: Callable[[T], R], index: int, total: int, item: T, name: str) -> tuple[int, R]:
    """Run one job; on failure add a note naming the job to the exception (kept picklable) and re-raise."""
    try:
        return index, func(item)
    except Exception as exc:
        exc.add_note(f"bayes_grpo.parallel: job {index + 1}/{total} ({name}) failed")
        raise


@contextlib.contextmanager
def _dask_backend(cluster: str) -> Iterator[None]:
    """Connect to (or start) a Dask cluster and make it joblib's backend inside the block."""
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BayesGrpoError(f"cluster={cluster!r} needs dask.distributed: pip install 'bayes_grpo[cluster]' ({exc})") from None
    with contextlib.ExitStack() as stack:
        if cluster.startswith(LOCAL_CLUSTER_PREFIX):
            try:
                workers = int(cluster[len(LOCAL_CLUSTER_PREFIX) :])
            except ValueError:
                raise BayesGrpoError(f"cluster={cluster!r}: write 'local:N' with N the number of workers, e.g. 'local:2'") from None
            if workers < 1:
                raise BayesGrpoError(f"cluster={cluster!r}: a local cluster needs at least 1 worker")
            # Non-daemonic workers, so a job may start its own processes (e.g. PyMC's parallel chains).
            stack.enter_context(dask.config.set({"distributed.worker.daemon": False}))
            local = stack.enter_context(
                LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40)
            )
            stack.enter_context(Client(local))
        else:
            try:
                stack.enter_context(Client(cluster, timeout=30))
            except OSError as exc:
                raise BayesGrpoError(f"cannot reach the Dask scheduler at {cluster!r}: {exc}") from None
        stack.enter_context(joblib.parallel_config(backend="dask", wait_for_workers_timeout=60))
        yield


def map_jobs(
    func: Callable[[T], R],
    items: Sequence[T],
    *,
    n_jobs: int | None = None,
    cluster: str | None = None,
    progress: bool = True,
    desc: str = "jobs",
    name: Callable[[T], str] = describe,
) -> list[R]:
    """Apply ``func`` to every item in parallel and return the results in input order.

    Parameters
    ----------
    func : callable
        A picklable function of one item (a module-level function or a
        ``functools.partial`` of one). Seed it from the item, not from global
        state, so the result does not depend on where it runs.
    items : sequence
        The jobs' inputs.
    n_jobs : int, optional
        Local worker processes (joblib's loky backend); ``1`` runs in this
        process; ``None`` uses every CPU, at most one per item. Ignored with
        ``cluster``, where every worker of the cluster is used.
    cluster : str, optional
        A Dask scheduler address (``"tcp://host:8786"``), or ``"local:N"`` to
        start a Dask ``LocalCluster`` of N worker processes for this call. The
        jobs then run through ``joblib.parallel_config(backend="dask")``.
    progress : bool
        Show a progress bar (jobs done n/N, elapsed and remaining time).
    desc : str
        Label of the progress bar.
    name : callable
        Names an item in error messages (default :func:`describe`).

    Returns
    -------
    list
        ``[func(item) for item in items]``, in the order of ``items``.

    Raises
    ------
    Exception
        The first exception raised by a job, re-raised with its type kept and a
        note naming the job (``job 3/5 (fold 3) failed``).
    BayesGrpoError
        ``cluster`` is malformed or its scheduler cannot be reached.

    Example
    -------
    >>> from bayes_grpo.parallel import map_jobs
    >>> map_jobs(abs, [-1, 2, -3], n_jobs=1, progress=False)
    [1, 2, 3]
    """
    from tqdm.auto import tqdm

    items = list(items)
    total = len(items)
    if total == 0:
        return []
    if n_jobs is None:
        n_jobs = min(total, os.cpu_count() or 1)
    if cluster is not None:
        n_jobs = -1
    calls = (joblib.delayed(_run_one)(func, i, total, item, name(item)) for i, item in enumerate(items))
    results: list[Any] = [None] * total
    with _dask_backend(cluster) if cluster is not None else contextlib.nullcontext():
        parallel = joblib.Parallel(n_jobs=n_jobs, return_as="generator_unordered", batch_size=1, pre_dispatch="all")
        with tqdm(total=total, desc=desc, disable=not progress, unit="job", dynamic_ncols=True) as bar:
            for index, result in parallel(calls):
                results[index] = result
                bar.update(1)
    return results
