"""`bayes-grpo demo --quick`, the first command a newcomer runs: the shipped model, no convergence warning, no red flag."""

from __future__ import annotations

import re


from bayes_grpo.cli import main



def test_quick_demo_uses_the_shipped_model_and_raises_no_flag(tmp_path, capsys, recwarn):
    assert main(["demo", "--quick", "--shown", "1", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "quick mode: the shipped model" in captured.err and "about" in captured.err
    assert re.search(r"\(all \d+ bundled runs among them\)", captured.err) and "of these" not in captured.err
    assert "converged" not in captured.err.replace("looks converged", "")
    assert not [w for w in recwarn if "converged" in str(w.message)]
    assert "stop decisions from 30% of each run's steps" in captured.out
    report = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "looks converged" in report and not re.search(r'class="bad"', report)
