"""Reward-curve forms in normalised training progress, in NumPy and PyTensor.

Every form maps normalised progress ``t`` (step / total steps, so the planned run
is ``0 <= t <= 1``) to a reward that starts at ``r0`` and moves by ``gain`` as
``t`` grows, through a shape function ``F(t)`` with ``F(0) = 0`` and
``F(inf) = 1``:

    reward(t) = r0 + gain * F(t; tau, beta)

* ``weibull``   F = 1 - exp(-(t/tau)**beta): the stretched exponential; ``beta > 1``
  gives the slow start of GRPO curves, ``beta = 1`` is the exponential saturation
  law of arXiv 2507.18014 (v2+).
* ``exponential`` the Weibull with ``beta = 1`` (its slope is largest at t = 0).
* ``loglogistic`` F = 1 / (1 + (tau/t)**beta): a sigmoid in log-progress with
  midpoint ``tau`` (the ScaleRL law of arXiv 2510.13786, in progress instead of
  compute); its remaining gain decays as a power of t, not exponentially, so it
  keeps the slow late creep of real runs.
* ``logistic``  a sigmoid in t with midpoint ``tau`` and steepness ``beta / tau``,
  rescaled so that F(0) = 0 (the sigmoid law of arXiv 2507.18014 v1).

The same formulas are written once against an array namespace so that the NumPy
version (forecasting, live stopping) and the PyTensor version (the hierarchical
PyMC model) cannot drift apart.

The module also holds the deterministic reference: a least-squares fit of the
paper's law ``R(t) = c + gamma / (1 + exp(-delta (t - t0)))`` with its two phase
boundaries (end of slow start, start of plateau).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import optimize

from bayes_grpo.errors import BayesGrpoError

CurveForm = Literal["weibull", "loglogistic", "logistic", "exponential"]
CURVE_FORMS: tuple[str, ...] = ("weibull", "loglogistic", "logistic", "exponential")
# The log-logistic form is the default: in the benchmarks it mixed far better
# than the Weibull (r_hat 1.03 vs 1.17 at the same settings), forecast real runs
# about as well, and its power-law tail keeps the plateau rule from calling a
# run that still creeps up finished (see benchmarks/results/).
DEFAULT_FORM = "loglogistic"

_TINY_PROGRESS = 1e-6
# Where the second derivative of a logistic peaks: t0 -/+ ln(2 + sqrt 3) / delta.
_LOGISTIC_KNEE = float(np.log(2.0 + np.sqrt(3.0)))


def shape(form: str, t: Any, tau: Any, beta: Any, xp: Any = np) -> Any:
    """Fraction ``F(t)`` of the total gain reached at progress ``t`` (0 at t=0, 1 at t=inf).

    ``xp`` is the array namespace: ``numpy`` or ``pytensor.tensor``; arguments
    broadcast as in that namespace.
    """
    if form == "weibull":
        if xp is np:
            # (t / tau) ** beta overflows to inf for a tiny tau; exp(-inf) = 0 is the right limit.
            with np.errstate(over="ignore"):
                return 1.0 - np.exp(-((t / tau) ** beta))
        return 1.0 - xp.exp(-((t / tau) ** beta))
    if form == "exponential":
        return 1.0 - xp.exp(-t / tau)
    if form == "loglogistic":
        # sigmoid(beta * log(t / tau)) == 1 / (1 + (tau / t)**beta), finite (with gradients) at t = 0.
        return _sigmoid(beta * (xp.log(xp.maximum(t, _TINY_PROGRESS)) - xp.log(tau)), xp)
    if form == "logistic":
        steep = beta / tau
        at_zero = _sigmoid(-steep * tau, xp)
        return (_sigmoid(steep * (t - tau), xp) - at_zero) / (1.0 - at_zero)
    raise BayesGrpoError(f"unknown curve form {form!r}; choose one of {', '.join(CURVE_FORMS)}")


def reward_curve(form: str, t: Any, r0: Any, gain: Any, tau: Any, beta: Any, xp: Any = np) -> Any:
    """Expected reward ``r0 + gain * F(t)`` for a curve form (see module docstring)."""
    return r0 + gain * shape(form, t, tau, beta, xp)


def plateau_progress(form: str, tau: Any, beta: Any, level: float = 0.95) -> Any:
    """Progress ``t`` at which the curve has reached ``level`` of its total gain (NumPy)."""
    tau = np.asarray(tau, dtype=float)
    beta = np.asarray(beta, dtype=float)
    if form == "weibull":
        return tau * (-np.log1p(-level)) ** (1.0 / beta)
    if form == "exponential":
        return tau * -np.log1p(-level) + 0.0 * beta
    if form == "loglogistic":
        return tau * (level / (1.0 - level)) ** (1.0 / beta)
    if form == "logistic":
        steep = beta / tau
        at_zero = 1.0 / (1.0 + np.exp(steep * tau))
        target = at_zero + level * (1.0 - at_zero)
        return tau + np.log(target / (1.0 - target)) / steep
    raise BayesGrpoError(f"unknown curve form {form!r}; choose one of {', '.join(CURVE_FORMS)}")


def _sigmoid(x: Any, xp: Any) -> Any:
    if xp is np:
        return 0.5 * (1.0 + np.tanh(0.5 * x))
    return xp.sigmoid(x)


@dataclass(frozen=True)
class PaperLawFit:
    """Least-squares fit of ``R(t) = c + gamma / (1 + exp(-delta (t - t0)))``.

    ``c`` absorbs the paper's ``alpha * R_init + beta * N_B`` terms, which are
    constant within one run. ``slow_start_end`` and ``plateau_start`` are the two
    phase boundaries: the progress values where the curvature of the sigmoid
    peaks, ``t0 -/+ ln(2 + sqrt 3) / delta``.
    """

    c: float
    gamma: float
    delta: float
    t0: float
    rmse: float

    def predict(self, t: np.ndarray) -> np.ndarray:
        """Reward predicted at normalised progress ``t``."""
        t = np.asarray(t, dtype=float)
        return self.c + self.gamma / (1.0 + np.exp(-self.delta * (t - self.t0)))

    @property
    def slow_start_end(self) -> float:
        return self.t0 - _LOGISTIC_KNEE / self.delta

    @property
    def plateau_start(self) -> float:
        return self.t0 + _LOGISTIC_KNEE / self.delta


def fit_paper_law(t: np.ndarray, reward: np.ndarray) -> PaperLawFit:
    """Fit the paper's sigmoid law to one run by least squares (scipy), from a few starts.

    This is the deterministic point-fit reference that the Bayesian model is
    compared against. ``t`` is normalised progress, ``reward`` the logged rewards.
    """
    t = np.asarray(t, dtype=float)
    y = np.asarray(reward, dtype=float)
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep]
    if t.size < 4:
        raise BayesGrpoError(f"the paper-law fit needs at least 4 logged steps, got {t.size}")
    spread = max(float(np.ptp(y)), 1e-6)
    t_span = max(float(t.max()), 1e-6)

    def residuals(theta: np.ndarray) -> np.ndarray:
        c, gamma, log_delta, t0 = theta
        return c + gamma / (1.0 + np.exp(-np.exp(log_delta) * (t - t0))) - y

    best = None
    for t0_start in (0.25 * t_span, 0.5 * t_span, t_span, 2.0 * t_span):
        for delta_start in (4.0 / t_span, 12.0 / t_span):
            start = np.array([y[: max(3, y.size // 10)].mean(), spread, np.log(delta_start), t0_start])
            result = optimize.least_squares(
                residuals,
                start,
                bounds=([-np.inf, -10 * spread, np.log(0.1 / t_span), -t_span], [np.inf, 10 * spread, np.log(200.0 / t_span), 5 * t_span]),
                loss="soft_l1",
                f_scale=spread / 4,
            )
            if best is None or result.cost < best.cost:
                best = result
    c, gamma, log_delta, t0 = best.x
    rmse = float(np.sqrt(np.mean(residuals(best.x) ** 2)))
    return PaperLawFit(c=float(c), gamma=float(gamma), delta=float(np.exp(log_delta)), t0=float(t0), rmse=rmse)
