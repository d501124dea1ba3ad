"""Model sizes: billions taken as given, raw parameter counts converted with a warning, implausible sizes rejected.

The same bounds (:func:`bayes_grpo.logs.types.params_in_billions`) apply to ``read_log``
arguments, metadata found in a log, :class:`RunMetadata` built directly, ``with_meta`` and
the CLI's ``--params-b``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bayes_grpo as bg
from bayes_grpo.cli import main
from bayes_grpo.logs import LogWarning
from bayes_grpo.logs.types import MAX_PARAMS_B, RAW_PARAMS_MIN, params_in_billions

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FRAME = pd.DataFrame({"step": [1, 2, 3], "reward": [0.1, 0.2, 0.3]})


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_every_size_is_kept_converted_or_rejected(value):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            billions = params_in_billions(value)
        except bg.LogError as exc:
            assert not (0 < value <= MAX_PARAMS_B or RAW_PARAMS_MIN <= value <= MAX_PARAMS_B * 1e9)
            assert "params_b=" in str(exc) and "billions" in str(exc)
            return
    assert 0 < billions <= MAX_PARAMS_B  # whatever was accepted is a plausible size in billions
    if value <= MAX_PARAMS_B:
        assert billions == value and not caught
    else:
        assert billions == pytest.approx(value / 1e9) and [w.category for w in caught] == [LogWarning]
        assert "raw parameter count" in str(caught[0].message)


@pytest.mark.parametrize("value", [0.0, -1.5, math.inf, 2_000.5, 50_000.0, 99_999.0, 3e12])
def test_implausible_sizes_are_rejected_with_the_bounds(value):
    with pytest.raises(bg.LogError, match="params_b") as info:
        params_in_billions(value)
    assert "e.g. 1.5" in str(info.value)


def test_read_log_converts_a_raw_count_and_says_so():
    with pytest.warns(LogWarning, match=r"params_b=1\.5e\+09 .*raw parameter count: 1\.5 billion"):
        run = bg.read_log(FRAME, params_b=1.5e9)
    assert run.params_b == 1.5 and run.meta.provenance["params_b"] == "argument"
    with pytest.warns(LogWarning, match="raw parameter count"):
        assert run.with_meta(params_b=7e9).params_b == 7.0
    assert bg.read_log(FRAME, params_b=1e-5).params_b == 1e-5  # the bundled runs' tiny models stay as they are


def test_read_log_rejects_sizes_between_the_bounds_and_non_positive_ones():
    for value, match in ((5_000, "is neither a model size in billions"), (-1.0, "must be positive"), (0, "must be positive")):
        with pytest.raises(bg.LogError, match=match):
            bg.read_log(FRAME, params_b=value)


def test_a_size_found_in_a_log_is_checked_too(tmp_path):
    path = tmp_path / "run.csv"
    FRAME.assign(params_b=494_032_768).to_csv(path, index=False)
    with pytest.warns(LogWarning, match=r"run\.csv: params_b=4\.94033e\+08"):
        assert bg.read_log(path).params_b == pytest.approx(0.494032768)
    FRAME.assign(params_b=7_000).to_csv(path, index=False)
    with pytest.raises(bg.LogError, match=r"run\.csv: params_b=7000 is neither"):
        bg.read_log(path)


def test_run_metadata_built_directly_converts_and_rejects():
    with pytest.warns(LogWarning):
        assert bg.RunMetadata(params_b=8e9).params_b == 8.0
    with pytest.raises(bg.LogError, match="log.csv: params_b=3000"):
        bg.RunMetadata(params_b=3_000, source="log.csv")


def test_cli_converts_a_raw_count_with_a_warning_line(capsys):
    assert main(["inspect", str(FIXTURES / "trl_tiny"), "--params-b", "1e9"]) == 0
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "bayes-grpo: warning: --params-b 1e9 is far above" in err and "1 billion parameters" in err
    assert any(line.split() == ["params_b", "1"] for line in out.splitlines())


def test_cli_rejects_a_size_between_the_bounds(capsys):
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(FIXTURES / "trl_tiny"), "--params-b", "5000"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "argument --params-b: 5000 is neither a model size in billions" in err
