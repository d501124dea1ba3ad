"""PlateauStoppingCallback in multi-process training: one decision, taken on the main process, for every rank.

The two-process run (``tests/fixtures/two_process_grpo.py``) is a real GRPOTrainer under
``torch.distributed.run`` on CPU with gloo, whose ranks are given different stop thresholds:
were each rank to decide on its own, rank 0 would stop while rank 1 went on into the next
step's collectives, and the run would die with a gloo collective mismatch. The model-size tests
check that a sharded model (DeepSpeed ZeRO-3, FSDP) is sized from its config, not its shards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bayes_grpo.callback import PlateauStoppingCallback
from bayes_grpo.model_size import _config_parameter_count, _sharded
from bayes_grpo.model_size import parameter_count as _parameter_count

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "fixtures" / "two_process_grpo.py"
#: Seconds the two-process run may take (about 30-45 s on 2 shared CPU cores).
TIMEOUT_S = 240


def _gloo() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


def _tiny_llama(**overrides: object) -> LlamaForCausalLM:
    options = dict(
        vocab_size=45, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    options.update(overrides)
    return LlamaForCausalLM(LlamaConfig(**options))


@pytest.mark.slow
@pytest.mark.skipif(not _gloo(), reason="torch.distributed with the gloo backend is not available in this torch build")
def test_two_processes_with_different_thresholds_stop_together_at_rank_0s_decision(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    # Its own session, so that a run past the timeout is killed with its worker processes, not just the launcher.
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the two-process run took more than {TIMEOUT_S} s (a hang in a collective?):\n{output[-4000:]}")
    seconds = time.perf_counter() - start
    assert process.returncode == 0, f"the two-process run failed after {seconds:.0f} s:\n{output[-4000:]}"

    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    main, other = ranks
    assert all(r["distributed"] and r["world_size"] == 2 for r in ranks)
    assert main["is_world_process_zero"] and not other["is_world_process_zero"]
    # Rank 0's rule (threshold 0.55) stopped the run early; rank 1 (0.99) stopped with it, at the same step.
    assert main["stopped_at"] is not None and main["stopped_at"] < 20 and main["stop_reason"] == "plateau"
    assert other["stopped_at"] == main["stopped_at"] == main["global_step"] == other["global_step"]
    # Only rank 0 forecast; rank 1 got its decisions, taken at rank 0's threshold, and logged the same keys.
    assert main["forecasts"] == len(main["decisions"]) >= 1 and other["forecasts"] == 0
    assert other["decisions"] == main["decisions"] and all(d[2] == 0.55 for d in other["decisions"])
    assert other["logged_probability_steps"] == main["logged_probability_steps"] == [d[0] for d in main["decisions"]]
    # One stop message, printed by rank 0; no warnings from the callback on either rank.
    assert len(main["messages"]) == 1 and f"step {main['stopped_at']}" in main["messages"][0] and other["messages"] == []
    assert main["warnings"] == [] and other["warnings"] == []
    assert main["params_b"] == other["params_b"] == pytest.approx(4048 / 1e9)  # the fixture's 1-layer Llama


@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_word_embeddings": True}, {"num_key_value_heads": 4, "num_hidden_layers": 3}, {"head_dim": 8, "attention_bias": True}],
)
def test_the_config_estimate_of_a_tiny_llama_is_near_its_true_size(overrides: dict[str, object]) -> None:
    model = _tiny_llama(**overrides)
    true = model.num_parameters()
    assert _config_parameter_count(model.config) == pytest.approx(true, rel=0.2)
    assert not _sharded(model) and _parameter_count(model) == true  # whole parameters: counted exactly, as before


def _shard_like_zero3(model: torch.nn.Module) -> None:
    """Leave each parameter as DeepSpeed ZeRO-3 does: an empty placeholder, its full size in ``ds_numel``."""
    for param in model.parameters():
        param.ds_numel = param.numel()
        param.data = torch.empty(0)


def test_a_sharded_model_is_sized_from_its_config_not_its_shards() -> None:
    model = _tiny_llama()
    true = model.num_parameters()
    _shard_like_zero3(model)
    assert model.num_parameters() == 0 and _sharded(model)
    assert _parameter_count(model) == pytest.approx(true, rel=0.2)
    callback = PlateauStoppingCallback(verbose=False)
    callback._describe(model)
    assert callback.family == "llama" and callback.params_b == pytest.approx(true / 1e9, rel=0.2)


def test_a_sharded_model_without_dimensions_falls_back_to_the_recorded_sizes() -> None:
    model = _tiny_llama()
    true = model.num_parameters()
    _shard_like_zero3(model)
    bare = types.SimpleNamespace(parameters=model.parameters, config=None)  # no dimensions to estimate from
    assert _sharded(bare) and _parameter_count(bare) == true
