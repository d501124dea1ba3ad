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
PyMC model) cannot drift apart. Forms live in a registry, :data:`CURVE_FORMS`
(name -> :class:`CurveForm`: shape function, parameter names, prior centre of
log beta, plateau progress, and where it has one a formula for F(t) / F(1) that
stays finite when F(1) underflows, :func:`relative_shape`); adding a form means adding one entry.

The module also holds the deterministic reference: a least-squares fit of the
paper's law ``R(t) = c + gamma / (1 + exp(-delta (t - t0)))`` with its two phase
boundaries (end of slow start, start of plateau).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy import optimize
from scipy.special import expit

from bayes_grpo.errors import BayesGrpoError

_TINY_PROGRESS = 1e-6
# Floor of a denominator that only reaches zero in floating-point underflow.
_TINY_SHARE = 1e-300
# Smallest logit of F(1) the log-logistic's F(t) / F(1) is computed at (F(1) = 9.4e-14 there).
_END_LOGIT_FLOOR = -30.0
# Where the second derivative of a logistic peaks: t0 -/+ ln(2 + sqrt 3) / delta.
_LOGISTIC_KNEE = float(np.log(2.0 + np.sqrt(3.0)))


def _sigmoid(x: Any, xp: Any) -> Any:
    # scipy's expit keeps its relative precision far into the lower tail (0.5 * (1 + tanh(x / 2))
    # loses it there, which F(t) / F(1) divides by).
    return expit(x) if xp is np else xp.sigmoid(x)


def _weibull(t: Any, tau: Any, beta: Any, xp: Any) -> Any:
    if xp is np:
        # (t / tau) ** beta overflows to inf for a tiny tau; exp(-inf) = 0 is the right limit.
        with np.errstate(over="ignore"):
            return 1.0 - np.exp(-((t / tau) ** beta))
    return 1.0 - xp.exp(-((t / tau) ** beta))


def _weibull_relative(t: Any, tau: Any, beta: Any, xp: Any) -> Any:
    # (1 - exp(-u_t)) / (1 - exp(-u_1)) with expm1: exact when both u are tiny (tau far beyond the plan).
    with np.errstate(over="ignore"):  # NumPy: u overflows to inf for a tiny tau, and expm1(-inf) = -1 is right
        return xp.expm1(-((t / tau) ** beta)) / xp.minimum(xp.expm1(-((1.0 / tau) ** beta)), -_TINY_SHARE)


def _weibull_plateau(tau: np.ndarray, beta: np.ndarray, level: float) -> np.ndarray:
    return tau * (-np.log1p(-level)) ** (1.0 / beta)


def _exponential(t: Any, tau: Any, beta: Any, xp: Any) -> Any:
    return 1.0 - xp.exp(-t / tau)


def _exponential_relative(t: Any, tau: Any, beta: Any, xp: Any) -> Any:
    return _weibull_relative(t, tau, 1.0, xp)


def _exponential_plateau(tau: np.ndarray, beta: np.ndarray, level: float) -> np.ndarray:
    return tau * -np.log1p(-level) + 0.0 * beta


def _loglogistic(t: Any, tau: Any, beta: Any, xp: Any) -> Any:
    # sigmoid(beta * log(t / tau)) == 1 / (1 + (tau / t)**beta), finite (with gradients) at t = 0.
    return _sigmoid(beta * (xp.log(xp.maximum(t, _TINY_PROGRESS)) - xp.log(tau)), xp)


def _loglogistic_relative(t: Any, tau: Any, beta: Any, xp: Any) -> Any:
    # sigmoid(end + beta log t) / sigmoid(end), end = logit F(1) = -beta log(tau), floored at _END_LOGIT_FLOOR:
    # below it the ratio is t^beta to a relative 1e-13 whatever tau, so the floor changes nothing
    # measurable, keeps F(1) from underflowing, and costs one exp per point like F(t) itself
    # (the same ratio in log space, exp(log F(t) - log F(1)), was 60% slower per gradient).
    end = xp.maximum(-beta * xp.log(tau), _END_LOGIT_FLOOR)
    return _sigmoid(end + beta * xp.log(xp.maximum(t, _TINY_PROGRESS)), xp) / _sigmoid(end, xp)


def _loglogistic_plateau(tau: np.ndarray, beta: np.ndarray, level: float) -> np.ndarray:
    return tau * (level / (1.0 - level)) ** (1.0 / beta)


def _logistic(t: Any, tau: Any, beta: Any, xp: Any) -> Any:
    steep = beta / tau
    at_zero = _sigmoid(-steep * tau, xp)
    return (_sigmoid(steep * (t - tau), xp) - at_zero) / (1.0 - at_zero)


def _logistic_plateau(tau: np.ndarray, beta: np.ndarray, level: float) -> np.ndarray:
    steep = beta / tau
    at_zero = 1.0 / (1.0 + np.exp(steep * tau))
    target = at_zero + level * (1.0 - at_zero)
    return tau + np.log(target / (1.0 - target)) / steep


@dataclass(frozen=True)
class CurveForm:
    """One entry of the curve-form registry.

    Attributes
    ----------
    name : str
        Registry key (``"loglogistic"``, ...).
    shape : callable
        ``shape(t, tau, beta, xp)``: fraction of the total gain reached at progress ``t``
        (0 at t=0, 1 at t=inf), written against the array namespace ``xp``.
    plateau : callable
        ``plateau(tau, beta, level)`` (NumPy): progress at which ``level`` of the gain is reached.
    params : tuple of str
        The shape parameters the form uses (``("tau",)`` when it has no ``beta``).
    beta_prior_centre : float
        Prior centre of log(beta) in the hierarchy (0 for a form without beta).
    description : str
        One line for docs and ``--help``.
    relative : callable or None
        ``relative(t, tau, beta, xp)``: ``F(t) / F(1)`` computed without underflow, for
        :func:`relative_shape`; None when the form has no such formula.
    """

    name: str
    shape: Callable[[Any, Any, Any, Any], Any]
    plateau: Callable[[np.ndarray, np.ndarray, float], np.ndarray]
    params: tuple[str, ...]
    beta_prior_centre: float
    description: str
    relative: Callable[[Any, Any, Any, Any], Any] | None = None

    @property
    def has_beta(self) -> bool:
        """Whether the form has a shape parameter ``beta`` (else beta is fixed at 1)."""
        return "beta" in self.params


#: The registry: adding a curve form means adding one entry here.
CURVE_FORMS: dict[str, CurveForm] = {
    form.name: form
    for form in (
        CurveForm("weibull", _weibull, _weibull_plateau, ("tau", "beta"), float(np.log(1.5)),
                  "stretched exponential 1 - exp(-(t/tau)^beta); beta > 1 gives the slow start", _weibull_relative),
        CurveForm("loglogistic", _loglogistic, _loglogistic_plateau, ("tau", "beta"), float(np.log(2.0)),
                  "sigmoid in log-progress 1 / (1 + (tau/t)^beta) (ScaleRL's law); power-law tail", _loglogistic_relative),
        CurveForm("logistic", _logistic, _logistic_plateau, ("tau", "beta"), float(np.log(6.0)),
                  "sigmoid in t with midpoint tau and steepness beta/tau, F(0) = 0 (arXiv 2507.18014 v1)"),
        CurveForm("exponential", _exponential, _exponential_plateau, ("tau",), 0.0,
                  "1 - exp(-t/tau), the Weibull with beta = 1 (arXiv 2507.18014 v2+)", _exponential_relative),
    )
}
# The log-logistic form is the default: in the benchmarks it mixed far better
# than the Weibull (r_hat 1.03 vs 1.17 at the same settings), forecast real runs
# about as well, and its power-law tail keeps the plateau rule from calling a
# run that still creeps up finished (see benchmarks/results/).
DEFAULT_FORM = "loglogistic"


def get_form(form: str) -> CurveForm:
    """The registry entry of a curve form.

    Raises
    ------
    BayesGrpoError
        For a name that is not in :data:`CURVE_FORMS`.
    """
    try:
        return CURVE_FORMS[form]
    except KeyError:
        raise BayesGrpoError(f"unknown curve form {form!r}; choose one of {', '.join(CURVE_FORMS)}") from None


def shape(form: str, t: Any, tau: Any, beta: Any, xp: Any = np) -> Any:
    """Fraction ``F(t)`` of the total gain reached at progress ``t`` (0 at t=0, 1 at t=inf).

    ``xp`` is the array namespace: ``numpy`` or ``pytensor.tensor``; arguments
    broadcast as in that namespace.
    """
    return get_form(form).shape(t, tau, beta, xp)


#: Smallest ``F(1)`` that :func:`relative_shape` divides by for a form without a ``relative`` formula.
SMALLEST_END_SHARE = 1e-12


def relative_shape(form: str, t: Any, tau: Any, beta: Any, xp: Any = np) -> Any:
    """``F(t) / F(1)``: the share of the gain reached by the end of the plan (progress 1) reached at ``t``.

    Computed by the form's own ``relative`` formula where it has one, so it stays
    finite and smooth when ``F(1)`` is tiny (a late, sharp take-off: for a log-logistic with
    ``beta * log(tau)`` above ~28, ``F(1) < 1e-12``, above ~745 it is 0 in floating point, and
    the curve is ``t ** beta``). Dividing by ``F(1)`` floored at :data:`SMALLEST_END_SHARE`
    would put a kink in the fit's log-density there, where NUTS diverges (in one fold fit, 2 of
    10 divergences sat on it, in 2% of the draws).
    """
    entry = get_form(form)
    if entry.relative is None:
        return entry.shape(t, tau, beta, xp) / xp.maximum(entry.shape(1.0, tau, beta, xp), SMALLEST_END_SHARE)
    return entry.relative(t, tau, beta, xp)


def reward_curve(form: str, t: Any, r0: Any, gain: Any, tau: Any, beta: Any, xp: Any = np) -> Any:
    """Expected reward ``r0 + gain * F(t)`` for a curve form (see module docstring)."""
    return r0 + gain * shape(form, t, tau, beta, xp)


def plateau_progress(form: str, tau: Any, beta: Any, level: float = 0.95) -> Any:
    """Progress ``t`` at which the curve has reached ``level`` of its total gain (NumPy); ``inf`` for a curve so slow
    that it overflows (a plateau beyond any horizon, without a warning)."""
    with np.errstate(over="ignore"):
        return get_form(form).plateau(np.asarray(tau, dtype=float), np.asarray(beta, dtype=float), level)


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
        return self.c + self.gamma * expit(self.delta * (t - self.t0))

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
        return c + gamma * expit(np.exp(log_delta) * (t - t0)) - y

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
