"""Package-wide defaults and locations, defined once.

Every module that needs a default stop threshold, the final-reward window, the
smoothing bandwidth or the folder of the bundled runs reads it from here, so
changing one of them is a one-line change. (The evaluation defaults and the
folder of the shared external runs are in the repository's ``evaluation/``
package, which is not shipped.)
"""

from __future__ import annotations

import os
from pathlib import Path

#: The confidence of the stopping rule's threshold mode: it stops on a plateau when P(no material gain
#: left) reaches this, and only while P(a rise just ahead) and, in a dip, P(getting back to the best)
#: are below 1 minus this (see :mod:`bayes_grpo.stopping`, which says how it was chosen).
STOP_THRESHOLD = 0.99
#: Remaining gain below this fraction of the reward scale counts as "plateaued".
STOP_TOLERANCE = 0.02
#: Final reward = mean reward over this trailing fraction of a run's logged steps.
FINAL_WINDOW_FRACTION = 0.1
#: Logged rewards the persistence forecast averages (the last ones): the baseline every forecast is set against.
PERSISTENCE_POINTS = 10
#: Bandwidth (fraction of a run's steps) of the Gaussian-kernel smoother used for
#: regret, best-step and curve-shape statistics.
SMOOTHING_BANDWIDTH = 0.08
#: Quantiles reported by forecasts and scored by the quantile (pinball) score.
FORECAST_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def quick_mode() -> bool:
    """True when ``BAYES_GRPO_QUICK`` is set: tests and CI use short sampler runs."""
    return os.environ.get("BAYES_GRPO_QUICK", "").strip().lower() not in ("", "0", "false", "no")


_REPO_BUNDLED = Path(__file__).resolve().parents[1] / "data" / "runs"


def bundled_runs_dir() -> Path:
    """Folder of the GRPO runs this project generated and bundles.

    In a source checkout (editable install included) this is the repository's
    ``data/runs``; in an installed wheel, ``runs/`` inside the
    ``bayes_grpo_data`` package (``setup.py`` maps the repository's ``data/``
    folder to that name, so the wheel carries the runs).

    Returns
    -------
    Path
        The folder; it may not exist when neither is present (``load_runs``
        then says so).

    Example
    -------
    >>> bundled_runs_dir().name
    'runs'
    """
    if _REPO_BUNDLED.is_dir():
        return _REPO_BUNDLED
    import importlib.util

    spec = importlib.util.find_spec("bayes_grpo_data")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))) / "runs"
    return _REPO_BUNDLED


_REPO_SWEEPS = Path(__file__).resolve().parents[1] / "data" / "sweeps"


def bundled_sweep_dir(name: str = "lr") -> Path:
    """Folder of a held-out sweep this project generated and bundles (``data/sweeps/<name>``).

    ``lr`` is the learning-rate sweep of :mod:`bayes_grpo.experiments.sweep` (``--slice lr``):
    runs of one setting that differ only in the GRPO learning rate, to judge ranking and
    pruning on. These runs are not in :func:`bundled_runs_dir`, so ``load_runs()`` and the
    shipped model's fit never see them; read them with ``load_runs(bundled_sweep_dir("lr"))``.
    Resolved like :func:`bundled_runs_dir`: the checkout's ``data/sweeps/<name>``, else
    ``sweeps/<name>`` inside the installed ``bayes_grpo_data`` package.

    Parameters
    ----------
    name : str
        Sweep name (the folder under ``data/sweeps``).

    Returns
    -------
    Path
        The folder; it may not exist.

    Example
    -------
    >>> bundled_sweep_dir().parts[-2:]
    ('sweeps', 'lr')
    """
    if _REPO_SWEEPS.is_dir():
        return _REPO_SWEEPS / name
    return bundled_runs_dir().parent / "sweeps" / name


#: ``source_repo`` of the runs the project generates (``bayes_grpo.experiments.generate``); each
#: bundled run's source is this plus ``/<task>``, so cross-validation can group them by task.
GENERATOR_SOURCE = "bayes_grpo/generator"
