"""``bayes-grpo report``: write the self-contained HTML report, optionally with a folder of benchmark results."""

from __future__ import annotations

import argparse
import os
import re
import warnings
from pathlib import Path

from bayes_grpo.cli._common import EXIT_OK, _add_encoding_arg, _positive_int, _progress_bars
from bayes_grpo.cli._loading import _load_model, _load_runs
from bayes_grpo.errors import BayesGrpoError

NAME = "report"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report (diagnostics, checks, forecasts, stopping)",
        description="Write one HTML file (figures embedded, opens offline) with the data, sampler diagnostics, "
        "posterior predictive checks, LOO comparison, population effects, forecast fan charts, stop probabilities "
        "and, with --results, the benchmark results a folder holds.",
    )
    parser.add_argument("--model", metavar="FILE", help="a model file saved by 'bayes-grpo fit' (default: the shipped model)")
    parser.add_argument("--runs", nargs="+", metavar="PATH", help="logs or folders of logs to show (default: the bundled runs)")
    _add_encoding_arg(parser)
    parser.add_argument("--out", required=True, metavar="FILE", help="HTML file to write, e.g. report.html")
    parser.add_argument("--quick", action="store_true", help="skip the LOO comparison of curve forms")
    parser.add_argument("--compare", action="store_true", help="fit the other curve forms and compare all by LOO (slow: two more fits)")
    parser.add_argument("--shown", type=_positive_int, default=4, help="runs shown in the per-run figures (default 4)")
    parser.add_argument(
        "--results", metavar="DIR",
        help="folder of benchmark results to embed, e.g. benchmarks/results: every *.md file, with the PNG files it "
        "shows as ![..](x.png) (default: none)",
    )  # fmt: skip


#: A markdown image reference to a PNG file: ``![alt](name.png)``.
_PNG_REFERENCE = re.compile(r"!\[[^\]]*\]\(\s*([^)\s]+\.png)\s*\)", re.IGNORECASE)


def read_results(folder: str | os.PathLike) -> dict[str, list[str | bytes]]:
    """The benchmark results in ``folder`` as :func:`bayes_grpo.report.write_report` takes them.

    Each ``*.md`` file (in name order) becomes one section, titled by its file name, holding its
    text and then the bytes of each PNG file it references as ``![..](x.png)`` (relative to the
    markdown file). A referenced PNG that is missing is left out with a warning.

    Parameters
    ----------
    folder : path-like
        A folder of markdown results, such as ``benchmarks/results``.

    Returns
    -------
    dict
        File name -> ``[markdown text, png bytes, ...]``.

    Raises
    ------
    BayesGrpoError
        When ``folder`` is not a folder or holds no ``*.md`` file.

    Example
    -------
    >>> results = read_results("benchmarks/results")  # doctest: +SKIP
    >>> write_report(model, runs, "report.html", results=results)  # doctest: +SKIP
    """
    root = Path(folder)
    if not root.is_dir():
        raise BayesGrpoError(f"--results {folder}: not a folder")
    files = sorted(root.glob("*.md"))
    if not files:
        raise BayesGrpoError(f"--results {folder}: no markdown (*.md) results in this folder")
    results: dict[str, list[str | bytes]] = {}
    for md in files:
        text = md.read_text(encoding="utf-8")
        items: list[str | bytes] = [text]
        for name in dict.fromkeys(_PNG_REFERENCE.findall(text)):
            png = md.parent / name
            if png.is_file():
                items.append(png.read_bytes())
            else:
                warnings.warn(f"{md} shows {name}, which is not there; left out of the report", RuntimeWarning, stacklevel=2)
        results[md.name] = items
    return results


def run(args: argparse.Namespace) -> int:
    from bayes_grpo.model import compare_forms
    from bayes_grpo.report import write_report

    results = read_results(args.results) if args.results else None
    model, runs = _load_model(args.model), _load_runs(args.runs, args.encoding)
    comparison = compare_forms(runs, progressbar=False)[0] if args.compare else None
    path = write_report(
        model, runs, args.out, quick=args.quick, comparison=comparison, n_shown=args.shown, results=results, progress=_progress_bars()
    )
    print(f"wrote {path}")
    return EXIT_OK
