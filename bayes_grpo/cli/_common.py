"""What every ``bayes-grpo`` command shares: one-line errors and warnings, the parser, argument types and options.

Bad input never shows a traceback: the parser's usage errors, out-of-range
options (the argparse types below) and the errors :func:`bayes_grpo.cli.main`
catches become one ``bayes-grpo: error: ...`` line on stderr, worded with the
command line's own flag names (:func:`_cli_wording`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from bayes_grpo.errors import BayesGrpoError

PROG = "bayes-grpo"
EXIT_OK, EXIT_BAD_INPUT = 0, 2
#: Exit code after a broken pipe: what a shell reports for a process killed by SIGPIPE (128 + 13).
EXIT_BROKEN_PIPE = 141
#: Below this many logged steps a forecast is mostly the population prior, and says so.
MIN_INFORMED_STEPS = 5
#: Below this many logged steps (and without --reward-range) there is no reward scale to forecast on.
MIN_SCALE_STEPS = 3
#: Python argument names in library messages -> the flags a CLI user types.
_FLAGS = {
    "total_steps": "--total-steps",
    "params_b": "--params-b",
    "reward_range": "--reward-range",
    "threshold": "--threshold",
    "tolerance": "--tolerance",
    "value_per_reward": "--value-per-reward",
    "cost_per_step": "--cost-per-step",
    "relative_to": "--relative-to",
}


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


def _error(message: object) -> None:
    """Print one error line (newlines folded) to stderr."""
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)


def _progress_bars() -> bool:
    """Whether to show progress bars: only when stderr is a terminal.

    Redirected to a file or captured (CI, ``2> log``), a bar's carriage returns and cursor
    moves would garble the log, so commands pass this as ``progress=`` / ``progressbar=``.
    """
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False


def _warn(message: object) -> None:
    """Print one warning line (newlines folded) to stderr."""
    print(f"{PROG}: warning: {_one_line(message)}", file=sys.stderr)


def _cli_wording(message: str, args: argparse.Namespace) -> str:
    """Reword a library message for the command line: ``pass total_steps=`` -> ``pass --total-steps``.

    Advice to pass an argument (``name=`` with no value) always names the flag.
    ``name=value`` and a bare ``name`` become ``--flag value`` / ``--flag`` only
    where the user gave that flag; otherwise the value came from the log's own
    metadata and keeps its field name.
    """

    def reword(match: re.Match[str]) -> str:
        name, assigned, value = match.group(1), match.group(2), match.group(3)
        if getattr(args, name, None) is not None:
            return f"{_FLAGS[name]} {value}" if value else _FLAGS[name]
        return _FLAGS[name] if assigned and not value else match.group(0)

    return re.sub(rf"\b({'|'.join(_FLAGS)})\b(=(\S*))?", reword, _advice_wording(message))


#: The library's advice to pass a range, ``reward_range=(min, max)``: Python syntax, which a CLI user types as ``--reward-range LO HI``.
_RANGE_ADVICE = re.compile(r"\breward_range=\(\s*min\s*,\s*max\s*\)")


def _advice_wording(message: str) -> str:
    """Reword only a library message's advice to pass an argument, for warnings and notes the command prints.

    ``pass reward_range=(min, max)`` -> ``pass --reward-range LO HI``, ``pass total_steps=`` ->
    ``pass --total-steps`` and the encoding advice (:func:`_encoding_wording`). Unlike
    :func:`_cli_wording` it leaves bare names and ``name=value`` alone: a warning's
    ``threshold`` or ``total_steps=1200`` may be the log's, not a flag the user typed.
    """
    message = _RANGE_ADVICE.sub("--reward-range LO HI", _encoding_wording(message))
    return re.sub(rf"\b({'|'.join(_FLAGS)})=(?!\S)", lambda match: _FLAGS[match.group(1)], message)


def _encoding_wording(message: str) -> str:
    """Reword the log reader's advice on text encodings for the command line.

    ``pass encoding='cp1252' (read_log/load_runs)`` -> ``pass --encoding cp1252``, and
    ``check the encoding= argument`` -> ``check --encoding``.
    """
    message = re.sub(r"""\bencoding=(['"])([^'"]+)\1(?: \(read_log/load_runs\))?""", r"--encoding \2", message)
    return message.replace("the encoding= argument", "--encoding")


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Show every warning (RuntimeWarnings included) as one ``bayes-grpo: warning:`` line, each once.

    Library advice to pass an argument names the flag instead (:func:`_advice_wording`).
    """

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: object = None, line: str | None = None) -> None:
        _warn(_advice_wording(str(message)))

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


#: The forecast's warning that its importance weights stay poor (:func:`bayes_grpo.forecast.condition`).
_POOR_WEIGHTS_WARNING = r".*importance weights stay poor"


@contextlib.contextmanager
def _caveats_printed() -> Iterator[None]:
    """Leave out the warnings that a forecast's printed notes (``Forecast.caveats``) repeat: one cause, one line.

    Poor importance weights are both a warning and a note of the forecast; a command that prints the
    notes shows that one (it has the same k-hat and ESS test) and not the warning too.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_POOR_WEIGHTS_WARNING)
        yield


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {_one_line(message)} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _number(text: str, kind: type) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _params_b(text: str) -> float:
    """argparse type: a model size in billions of parameters; a raw parameter count is converted with a warning.

    The bounds are :func:`bayes_grpo.logs.types.params_in_billions`'s, the ones ``read_log`` applies.
    """
    from bayes_grpo.errors import LogError
    from bayes_grpo.logs.types import params_in_billions

    value = _positive_float(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            billions = params_in_billions(value, text)
        except LogError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    for warning in caught:
        _warn(f"--params-b {warning.message}")
    return billions


def _non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _probability(text: str) -> float:
    """argparse type: a number strictly between 0 and 1."""
    value = _number(text, float)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {text}")
    return value


def _finite_float(text: str) -> float:
    """argparse type: any finite number."""
    return _number(text, float)


def _add_encoding_arg(parser: argparse.ArgumentParser) -> None:
    """``--encoding``: the text encoding of the logs (every command that reads logs)."""
    parser.add_argument("--encoding", metavar="NAME", help="text encoding of the log files, e.g. latin-1, cp1252 or utf-16 (default: UTF-8)")


def _add_run_metadata_args(parser: argparse.ArgumentParser) -> None:
    """Options that override metadata found in a log, and its encoding (shared by commands that read one log)."""
    _add_encoding_arg(parser)
    parser.add_argument("--family", help="model family, e.g. qwen, llama, gemma, phi (unknown: the population level)")
    parser.add_argument(
        "--params-b", type=_params_b,
        help="model size in billions of parameters, e.g. 1.5 (a raw count such as 1.5e9 is converted, with a warning)",
    )  # fmt: skip
    parser.add_argument("--total-steps", type=_positive_int, help="planned number of training steps (the trainer's max_steps)")
    parser.add_argument(
        "--reward-range", type=_finite_float, nargs=2, metavar=("LO", "HI"),
        help="lowest and highest reward the reward functions can give, e.g. 0 1 (default: a scale learned from the log)",
    )  # fmt: skip


def _reward_range(args: argparse.Namespace) -> tuple[float, float] | None:
    """``--reward-range LO HI`` as a tuple (None when not given); LO must be below HI."""
    if not args.reward_range:
        return None
    lo, hi = args.reward_range
    if not lo < hi:
        raise BayesGrpoError(f"--reward-range {lo:g} {hi:g}: LO must be below HI")
    return lo, hi


def _add_metric_args(parser: argparse.ArgumentParser) -> None:
    """``--metric`` and ``--minimize``: which logged per-step number to forecast, and whether lower is better."""
    parser.add_argument(
        "--metric", default="reward", metavar="NAME",
        help="the logged per-step metric to forecast, e.g. rewards/correctness_reward_func/mean, eval_reward or kl "
        "(default: reward, the summed reward; 'inspect' lists a log's metrics); --reward-range is then in its units",
    )  # fmt: skip
    parser.add_argument("--minimize", action="store_true", help="the metric is lower-is-better (a loss): forecast it falling")


def _metric(args: argparse.Namespace) -> dict[str, str]:
    """``read_log``'s ``metric`` and ``direction`` from ``--metric`` and ``--minimize``."""
    return {"metric": args.metric, "direction": "minimize" if args.minimize else "maximize"}


def _add_sampler_args(parser: argparse.ArgumentParser) -> None:
    """Sampler settings shared by ``fit`` and ``demo``."""
    from bayes_grpo.config import PARAMETERISATIONS, ModelConfig
    from bayes_grpo.curves import CURVE_FORMS, DEFAULT_FORM

    parser.add_argument("--quick", action="store_true", help="short sampler run (200 draws, 200 tuning steps): a few minutes, rougher intervals")
    parser.add_argument("--form", default=DEFAULT_FORM, choices=CURVE_FORMS, help=f"curve form of the reward rise (default: {DEFAULT_FORM})")
    parser.add_argument("--draws", type=_positive_int, help="posterior draws per chain (default 4000, 200 with --quick)")
    parser.add_argument("--tune", type=_positive_int, help="tuning steps per chain (default 500, 200 with --quick)")
    parser.add_argument("--chains", type=_positive_int, default=2, help="number of chains (default 2)")
    parser.add_argument(
        "--parameterisation", choices=PARAMETERISATIONS, default=ModelConfig.parameterisation,
        help=f"how NUTS sees the per-run parameters (default {ModelConfig.parameterisation}: 'mixed' from 100 runs up, "
        "'non_centred' below); 'mixed' (start as an offset, the rest centred) mixes fastest on large, varied run sets "
        "(e.g. the 201 bundled + shared runs), 'non_centred' is safer on small sweeps of similar runs",
    )  # fmt: skip
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="random seed of the sampler and the forecasts: one seed, one result (default 0)")


def _check_plot_file(args: argparse.Namespace) -> None:
    """Refuse a ``--plot`` file whose suffix is not one matplotlib writes here (.png, .pdf, .svg)."""
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise BayesGrpoError(f"--plot {args.plot}: give a file name ending in .png, .pdf or .svg")
