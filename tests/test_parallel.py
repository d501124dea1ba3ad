"""The parallel engine: joblib locally, Dask when a cluster is given; same results as a serial run."""

from __future__ import annotations

import pandas as pd
import pytest

from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.parallel import map_jobs
from evaluation.calibration import cross_validate, load_evaluation_runs
from evaluation.settings import shared_runs_dir


def _square_unless_three(x: int) -> int:
    if x == 3:
        raise ValueError("three is not allowed")
    return x * x


def test_map_jobs_keeps_input_order_on_local_processes() -> None:
    items = list(range(12, 0, -1))
    assert map_jobs(_square_unless_three, [i for i in items if i != 3], n_jobs=2, progress=False) == [i * i for i in items if i != 3]
    assert map_jobs(_square_unless_three, [], progress=False) == []


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_a_failing_job_raises_its_own_error_naming_the_job(n_jobs: int) -> None:
    with pytest.raises(ValueError, match="three is not allowed") as info:
        map_jobs(_square_unless_three, [1, 2, 3, 4], n_jobs=n_jobs, progress=False, name=lambda x: f"item {x}")
    assert any("job 3/4 (item 3) failed" in note for note in info.value.__notes__)


def test_malformed_cluster_address_is_a_one_line_error() -> None:
    with pytest.raises(BayesGrpoError, match="local:N"):
        map_jobs(abs, [1], cluster="local:two", progress=False)


def test_progress_shows_jobs_done_and_quiet_shows_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    map_jobs(abs, [-1, -2], n_jobs=1, progress=True, desc="squares")
    err = capsys.readouterr().err
    assert "squares" in err and "2/2" in err
    map_jobs(abs, [-1, -2], n_jobs=1, progress=False, desc="squares")
    assert capsys.readouterr().err == ""


def test_map_jobs_runs_on_a_dask_scheduler_given_by_address() -> None:
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tcp://")
        assert map_jobs(_square_unless_three, [5, 1, 2], cluster=address, progress=False) == [25, 1, 4]
        with pytest.raises(ValueError, match="three is not allowed") as info:
            map_jobs(_square_unless_three, [1, 3], cluster=address, progress=False)
        assert any("job 2/2 (3) failed" in note for note in info.value.__notes__)


@pytest.mark.slow
def test_grouped_cross_validation_on_a_local_dask_cluster_equals_the_serial_run(tmp_path) -> None:
    """Four real runs from four sources, two folds, short PyMC fits: Dask (2 workers) == serial == from cached fits."""
    if shared_runs_dir() is None:
        pytest.skip("needs the shared external runs (../shared/external_runs)")
    runs, sources = load_evaluation_runs(bundled=False, max_runs=4, seed=1)
    assert len(set(sources.values())) == 4
    options = dict(n_folds=2, fractions=(0.3,), fit_options={"draws": 30, "tune": 30, "chains": 2, "sampler": "pymc"}, seed=3, progress=False)
    serial = cross_validate(runs, sources, n_jobs=1, cache_dir=tmp_path, **options)
    on_dask = cross_validate(runs, sources, cluster="local:2", **options)
    from_cache = cross_validate(runs, sources, n_jobs=1, cache_dir=tmp_path, **options)
    assert not serial.folds["cached"].any() and from_cache.folds["cached"].all() and len(list(tmp_path.glob("fold-*.nc"))) == 2
    assert len(serial.scores) >= 2 and set(serial.scores["fold"]) == {0, 1}
    for fold in (0, 1):  # no source is on both sides of a fold
        held_out = set(serial.scores.loc[serial.scores["fold"] == fold, "source"])
        assert held_out and held_out.isdisjoint(serial.scores.loc[serial.scores["fold"] != fold, "source"])
    pd.testing.assert_frame_equal(serial.scores, on_dask.scores)
    pd.testing.assert_frame_equal(serial.scores, from_cache.scores)
    health = ["fold", "train_runs", "test_runs", "max_r_hat", "min_ess_bulk", "divergences"]
    pd.testing.assert_frame_equal(serial.folds[health], on_dask.folds[health])
