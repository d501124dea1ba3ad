"""The logs people really have (issue 15): W&B web-UI exports, cut JSONL, resumed runs, model names, encodings.

Fixtures are real files: ``trl_resumed/`` is a real TRL GRPOTrainer run that
was interrupted and resumed (``make_resumed_fixture.py``); the W&B, JSONL,
Latin-1 and notebook fixtures carry the rewards of the real TRL runs in the
layout of those tools (``make_shaped_fixtures.py``).
"""

from __future__ import annotations

import ast
import csv
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

import bayes_grpo as bg
from bayes_grpo.logs import LogWarning, read_runs

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RESUMED = FIXTURES / "trl_resumed"


def trainer_state_rewards(path: Path) -> dict[int, float]:
    """step -> reward straight from a trainer_state.json, without our reader."""
    return {e["step"]: e["reward"] for e in json.loads(path.read_text())["log_history"] if "reward" in e}


def read_quietly(source, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogWarning)
        return bg.read_log(source, **kwargs)


# ------------------------------------------------------------ W&B web-UI export


def wandb_columns(path: Path) -> dict[str, dict[int, float]]:
    """run -> {step: reward} read with the csv module only."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    out: dict[str, dict[int, float]] = {}
    for col in rows[0]:
        if col.endswith(" - train/reward"):
            run = col[: -len(" - train/reward")]
            out[run] = {int(r["Step"]): float(r[col]) for r in rows if r[col] != ""}
    return out


def test_wandb_ui_export_one_run():
    path = FIXTURES / "wandb_ui_one_run.csv"
    expected = wandb_columns(path)["grpo-tiny-resumed"]
    run = bg.read_log(path)
    assert run.run_id == "grpo-tiny-resumed"
    assert list(run.steps) == sorted(expected) == list(range(1, 21))
    np.testing.assert_array_equal(run.rewards, [expected[s] for s in run.steps])
    assert list(run.table.columns) == ["step", "reward"]  # __MIN / __MAX are not logged values
    assert run.meta.extra["export"] == "W&B web-UI chart export"
    # the same numbers as the real TRL run they come from
    truth = trainer_state_rewards(RESUMED / "checkpoint-20" / "trainer_state.json")
    np.testing.assert_allclose(run.rewards, [truth[s] for s in run.steps])
    assert bg.load_runs(path).run_ids == ["grpo-tiny-resumed"]


def test_wandb_ui_export_several_runs():
    path = FIXTURES / "wandb_ui_two_runs.csv"
    expected = wandb_columns(path)
    with pytest.raises(bg.LogError, match=r"holds 2 runs \('grpo-tiny', 'grpo-tiny-resumed'\).*load_runs.*read_runs"):
        bg.read_log(path)
    runs = bg.load_runs(path)
    assert isinstance(runs, bg.RunSet) and runs.run_ids == ["grpo-tiny", "grpo-tiny-resumed"]
    for run in runs:
        assert list(run.steps) == sorted(expected[run.run_id])  # the 6-step run does not get the other's steps
        np.testing.assert_array_equal(run.rewards, [expected[run.run_id][s] for s in run.steps])
    assert len(runs["grpo-tiny"]) == 6 and len(runs["grpo-tiny-resumed"]) == 20
    assert [r.run_id for r in read_runs(path, family="llama")] == runs.run_ids
    assert {r.family for r in read_runs(path, family="llama")} == {"llama"}


def test_load_runs_folder_expands_multi_run_exports(tmp_path):
    shutil.copy(FIXTURES / "wandb_ui_two_runs.csv", tmp_path / "export.csv")
    shutil.copytree(FIXTURES / "trl_tiny", tmp_path / "trl_tiny")
    assert bg.load_runs(tmp_path).run_ids == ["grpo-tiny", "grpo-tiny-resumed", "trl_tiny"]


def test_wandb_ui_export_problems(tmp_path):
    header = '"Step","a - train/reward","a - train/reward__MIN","a - train/reward__MAX"\n'
    (tmp_path / "dupe.csv").write_text('"Step","a - train/reward","a - train/reward"\n"1","0.1","0.2"\n')
    with pytest.raises(bg.LogError, match="repeated columns.*same name"):
        bg.read_log(tmp_path / "dupe.csv")
    (tmp_path / "time.csv").write_text(header.replace('"Step"', '"Relative Time (Process)"') + '"1","0.1","0.1","0.1"\n')
    with pytest.raises(bg.LogError, match="no step column.*Relative Time"):
        bg.read_log(tmp_path / "time.csv")
    (tmp_path / "text.csv").write_text(header + '"1","high","0.1","0.1"\n')
    with pytest.raises(bg.LogError, match="field 'reward' is not numeric"):
        bg.read_log(tmp_path / "text.csv")


def test_table_with_run_id_column_gives_one_run_per_id(tmp_path):
    (tmp_path / "runs.csv").write_text("run_id,step,reward\na,1,0.1\nb,1,0.5\na,2,0.2\nb,2,0.6\nb,3,0.7\n")
    with pytest.raises(bg.LogError, match="holds 2 runs.*load_runs"):
        bg.read_log(tmp_path / "runs.csv")
    runs = bg.load_runs(tmp_path / "runs.csv")
    assert runs.run_ids == ["a", "b"] and list(runs["b"].rewards) == [0.5, 0.6, 0.7]


# ------------------------------------------------------------------ cut JSONL


def test_truncated_last_jsonl_line_dropped_with_warning():
    path = FIXTURES / "metrics_truncated.jsonl"
    lines = path.read_text().splitlines()
    with pytest.warns(LogWarning, match=r"metrics_truncated\.jsonl: line 20 \(the last\) is cut off mid-write"):
        run = bg.read_log(path)
    assert len(run) == len(lines) - 1 == 19
    np.testing.assert_array_equal(run.rewards, [json.loads(line)["reward"] for line in lines[:-1]])


def test_broken_jsonl_line_in_the_middle_is_an_error(tmp_path):
    lines = (FIXTURES / "metrics_truncated.jsonl").read_text().splitlines()
    broken = [*lines[:5], lines[-1], *lines[5:-1]]
    (tmp_path / "m.jsonl").write_text("\n".join(broken) + "\n")
    with pytest.raises(bg.LogError, match=r"m\.jsonl: line 6 is not JSON"):
        bg.read_log(tmp_path / "m.jsonl")


def test_jsonl_cut_inside_a_multibyte_character(tmp_path):
    data = '{"step": 1, "reward": 0.5}\n{"step": 2, "reward": 0.6, "note": "é"}\n'.encode()
    (tmp_path / "m.jsonl").write_bytes(data[:-4])  # cuts the two-byte 'é' in half
    with pytest.warns(LogWarning, match="line 2 .* cut off"):
        run = bg.read_log(tmp_path / "m.jsonl")
    assert list(run.steps) == [1]


# ------------------------------------------------------------- resumed runs


def test_resumed_console_log_counts_each_step_once():
    """Real TRL output: 22 printed dicts for a 20-step run resumed from checkpoint-10 after step 12."""
    text = (RESUMED / "console.log").read_text()
    printed = [ast.literal_eval(m) for m in re.findall(r"\{[^{}]*'reward'[^{}]*\}", text)]
    assert len(printed) == 22
    with pytest.warns(LogWarning, match=r"resumed from a checkpoint; 2 logged step\(s\) were logged again \(steps 11, 12\)"):
        run = bg.read_log(RESUMED / "console.log")
    assert list(run.steps) == list(range(1, 21))
    truth = trainer_state_rewards(RESUMED / "checkpoint-20" / "trainer_state.json")
    np.testing.assert_allclose(run.rewards, [truth[s] for s in run.steps], rtol=1e-3)  # the later entries won


def test_resumed_200_step_console_log(tmp_path):
    """A 200-step run logged every step, resumed from checkpoint-100 after step 120: 200 steps, 20 replaced."""
    def line(step: int, reward: float) -> str:
        return str({"loss": "0.01", "reward": f"{reward:.4g}", "reward_std": "0.3", "epoch": f"{step / 400:.4g}"})

    first = [line(s, s / 1000) for s in range(1, 121)]
    second = [line(s, s / 1000 + 1) for s in range(101, 201)]
    (tmp_path / "train.log").write_text("\n".join([*first, "Resuming...", *second]) + "\n")
    with pytest.warns(LogWarning, match=r"20 logged step\(s\) were logged again \(steps 101, 102, 103, 104, 105, \.\.\.\)"):
        run = bg.read_log(tmp_path / "train.log")
    assert len(run) == 200 and list(run.steps) == list(range(1, 201))
    assert run.rewards[99] == pytest.approx(0.1) and run.rewards[100] == pytest.approx(1.101)


def test_resumed_unsloth_text_table(tmp_path):
    """Two progress tables, the second continuing the first from step 9: 12 steps, the second's rows win."""
    text = (FIXTURES / "unsloth_progress.txt").read_text()
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("Step"))
    rows = [line.split("\t") for line in lines[header + 1 :] if line.split("\t")[0].isdigit()]
    again = ["\t".join([r[0], r[1], "0.9", *r[3:]]) for r in rows if int(r[0]) >= 9]
    (tmp_path / "resumed.txt").write_text(text + "\n" + lines[header] + "\n" + "\n".join(again) + "\n")
    with pytest.warns(LogWarning, match=r"4 logged step\(s\) were logged again \(steps 9, 10, 11, 12\)"):
        run = bg.read_log(tmp_path / "resumed.txt")
    assert list(run.steps) == list(range(1, 13)) and list(run.rewards[8:]) == [0.9] * 4
    assert run.rewards[0] == pytest.approx(0.092593)
    (tmp_path / "rerun.txt").write_text(text + "\n" + lines[header] + "\n" + "\n".join("\t".join(r) for r in rows[:5]) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", LogWarning)  # a second run from step 1 is another run, not a resume
        assert len(bg.read_log(tmp_path / "rerun.txt")) == 12


def test_console_log_without_resume_is_unchanged():
    with warnings.catch_warnings():
        warnings.simplefilter("error", LogWarning)
        run = bg.read_log(FIXTURES / "trl_tiny" / "console.log")
    assert list(run.steps) == [1, 2, 3, 4, 5, 6]


def test_resumed_notebook_progress_tables():
    with pytest.warns(LogWarning, match=r"2 logged step\(s\) were logged again \(steps 11, 12\)"):
        run = bg.read_log(FIXTURES / "unsloth_resumed.ipynb")
    assert list(run.steps) == list(range(1, 21)) and run.total_steps == 20
    truth = trainer_state_rewards(RESUMED / "checkpoint-20" / "trainer_state.json")
    np.testing.assert_allclose(run.rewards, [truth[s] for s in run.steps], rtol=1e-3)


# ------------------------------------------------------- family and size


def test_family_and_size_from_notebook_code():
    run = read_quietly(FIXTURES / "unsloth_resumed.ipynb")
    assert (run.family, run.params_b) == ("qwen", 1.5)
    assert run.meta.extra["model"] == "unsloth/Qwen2.5-1.5B-Instruct"
    assert run.meta.provenance == {"family": "notebook", "params_b": "notebook", "total_steps": "notebook"}
    assert "family='qwen' [notebook], params_b=1.5 [notebook]" in repr(run)
    assert run.meta.describe()["params_b"] == "1.5 (notebook)"
    given = read_quietly(FIXTURES / "unsloth_resumed.ipynb", family="llama", params_b=3.0)
    assert (given.family, given.params_b) == ("llama", 3.0)
    assert given.meta.provenance["family"] == given.meta.provenance["params_b"] == "argument"


def test_family_from_config_json_beside_trainer_state():
    """The real config.json TRL saved in the checkpoint (model_type 'llama', no hub name)."""
    run = bg.read_log(RESUMED)
    assert run.run_id == "trl_resumed" and run.family == "llama" and run.params_b is None
    assert run.meta.provenance["family"] == "config.json" and run.meta.provenance["total_steps"] == "trainer_state.json"
    assert bg.read_log(RESUMED, family="qwen").meta.provenance["family"] == "argument"


def test_model_name_in_config_adapter_config_and_model_card(tmp_path):
    out = tmp_path / "outputs"
    shutil.copytree(RESUMED, out)
    checkpoint = out / "checkpoint-20"
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct"}))
    run = bg.read_log(out)
    assert (run.family, run.params_b) == ("qwen", 0.5) and run.meta.provenance["params_b"] == "config.json"
    assert run.meta.extra["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    (checkpoint / "config.json").unlink()  # a LoRA checkpoint keeps only the adapter config
    (checkpoint / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "unsloth/Llama-3.2-3B-Instruct", "r": 16}))
    run = bg.read_log(checkpoint / "trainer_state.json")
    assert (run.run_id, run.family, run.params_b) == ("outputs", "llama", 3.0)
    assert run.meta.provenance["family"] == "adapter_config.json"
    (checkpoint / "adapter_config.json").unlink()
    (out / "README.md").write_text("---\nbase_model: google/gemma-2-2b-it\nlibrary_name: transformers\n---\n# model card\n")
    run = bg.read_log(checkpoint / "trainer_state.json")
    assert (run.family, run.params_b) == ("gemma", 2.0) and run.meta.provenance["family"] == "README.md"


def test_model_name_in_console_printout(tmp_path):
    text = (FIXTURES / "trl_tiny" / "console.log").read_text()
    banner = "==((====))==  Unsloth 2025.3.19: Fast Gemma2 patching. Transformers: 4.50.0.\n"
    loading = "Unsloth: vLLM loading unsloth/gemma-2-2b-it-bnb-4bit with actual GPU utilization = 59.15%\n"
    (tmp_path / "gemma.log").write_text(banner + loading + text)
    run = bg.read_log(tmp_path / "gemma.log")
    assert (run.family, run.params_b) == ("gemma", 2.0) and run.meta.provenance["family"] == "console"
    cache = (
        "loading configuration file config.json from cache at "
        "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-0.5B-Instruct/snapshots/7ae5/config.json\n"
    )
    (tmp_path / "cache.log").write_text(cache + text)
    assert bg.read_log(tmp_path / "cache.log").meta.extra["model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    vllm = (
        "Initializing a V0 LLM engine (v0.8.1) with config: "
        "model='unsloth/qwen2.5-1.5b-instruct-unsloth-bnb-4bit', speculative_config=None\n"
    )
    (tmp_path / "vllm.log").write_text(vllm + text)
    assert (bg.read_log(tmp_path / "vllm.log").family, bg.read_log(tmp_path / "vllm.log").params_b) == ("qwen", 1.5)
    (tmp_path / "banner_only.log").write_text(banner + text)
    run = bg.read_log(tmp_path / "banner_only.log")
    assert (run.family, run.params_b) == ("gemma", None)


def test_model_column_gives_family_and_size(tmp_path):
    model = "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "r.csv").write_text(f"step,reward,model\n1,0.1,{model}\n2,0.2,{model}\n")
    run = bg.read_log(tmp_path / "r.csv")
    assert (run.family, run.params_b) == ("smollm", 0.135)
    assert run.meta.provenance == {"family": "model name (column)", "params_b": "model name (column)"}
    (tmp_path / "r.meta.json").write_text(json.dumps({"params_b": 0.13}))
    assert bg.read_log(tmp_path / "r.csv").meta.provenance["params_b"] == "sidecar"


# ---------------------------------------------------------------- encodings


def test_latin1_csv_names_the_encoding_problem():
    path = FIXTURES / "latin1_run.csv"
    with pytest.raises(bg.LogError) as info:
        bg.read_log(path)
    message = str(info.value)
    assert "latin1_run.csv: not valid UTF-8 (byte 0xe9 at position" in message and "line 2" in message
    assert "looks like Latin-1/cp1252" in message and "encoding=" in message
    assert "\n" not in message
    run = bg.read_log(path, encoding="latin-1")
    assert run.meta.extra["dataset"] == "opérations à deux chiffres" and len(run) == 6
    assert bg.load_runs(path, encoding="cp1252")[0].meta.extra["dataset"] == "opérations à deux chiffres"


def test_other_encoding_problems(tmp_path):
    (tmp_path / "u16.csv").write_text("step,reward\n1,0.5\n", encoding="utf-16")
    with pytest.raises(bg.LogError, match="it is UTF-16 text; pass encoding='utf-16'"):
        bg.read_log(tmp_path / "u16.csv")
    assert list(bg.read_log(tmp_path / "u16.csv", encoding="utf-16").rewards) == [0.5]
    with pytest.raises(bg.LogError, match="unknown encoding 'klingon'"):
        bg.read_log(tmp_path / "u16.csv", encoding="klingon")
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbfstep,reward\n1,0.5\n")
    assert list(bg.read_log(tmp_path / "bom.csv").steps) == [1]


@pytest.mark.slow
def test_fresh_resumed_grpotrainer_run_reads_back(tmp_path):
    """Re-run the resumed-run generator with the installed TRL: 22 printed dicts still load as 20 steps."""
    import subprocess
    import sys

    out = tmp_path / "resumed"
    subprocess.run([sys.executable, str(FIXTURES / "make_resumed_fixture.py"), str(out)], check=True, capture_output=True)
    with pytest.warns(LogWarning, match=r"2 logged step\(s\) were logged again \(steps 11, 12\)"):
        console = bg.read_log(out / "console.log")
    state = bg.read_log(out)
    assert list(console.steps) == list(state.steps) == list(range(1, 21))
    np.testing.assert_allclose(console.rewards, state.rewards, rtol=1e-3)
    assert state.family == "llama" and state.meta.provenance["family"] == "config.json"
