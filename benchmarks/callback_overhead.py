"""Overhead of PlateauStoppingCallback as a share of training time, in a real tiny GRPOTrainer run.

Trains the same tiny CPU GRPO run (2-layer Llama from a config, local char
tokenizer; see tests/fixtures/make_trl_fixture.py) twice, without and with the
callback at its default check schedule (it never stops: tolerance 0 gives probability 0, so both
runs do every step), and reports the time spent inside the callback's checks
relative to the callback-free training time. Tiny CPU steps are far faster than
real GRPO steps, so this is an upper bound on the overhead of a real run.

Usage::

    python benchmarks/callback_overhead.py [--model DIR] [--steps 100]

Writes ``benchmarks/results/callback_overhead.md`` with the command. The two
trainings run one after the other in this process: a parallel engine would
distort the timings.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import tempfile
import time
from pathlib import Path

import torch
from common import RESULTS, provenance
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, set_seed
from trl import GRPOConfig, GRPOTrainer

import bayes_grpo as bg
from bayes_grpo.callback import PlateauStoppingCallback

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_trl_fixture", ROOT / "tests" / "fixtures" / "make_trl_fixture.py")
_fixture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixture)  # type: ignore[union-attr]


class _TimedCallback(PlateauStoppingCallback):
    """The callback, with the wall time of every on_log accumulated."""

    seconds = 0.0

    def on_log(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        super().on_log(*args, **kwargs)
        self.seconds += time.perf_counter() - start


def _train(steps: int, callbacks: list) -> float:
    set_seed(0)
    torch.manual_seed(0)
    tokenizer = _fixture.build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=8, num_generations=4,
            max_completion_length=16, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none",
            use_cpu=True, bf16=False, seed=0, disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=LlamaForCausalLM(config), reward_funcs=[_fixture.digit_reward, _fixture.length_reward], args=args,
            train_dataset=Dataset.from_dict({"prompt": [f"what is {a} + {b} ?" for a in range(4) for b in range(4)]}),
            processing_class=tokenizer, callbacks=callbacks,
        )
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.train()
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="saved model folder (default: bg.default_model())")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    args = parser.parse_args()
    started = time.perf_counter()
    model = bg.load_model(args.model) if args.model else bg.default_model()
    baseline = _train(args.steps, [])
    callback = _TimedCallback(model, tolerance=0.0, verbose=False)
    with_callback = _train(args.steps, [callback])
    checks = len(callback.decisions)
    share = callback.seconds / baseline
    text = (
        f"| steps | train s (no callback) | train s (callback) | checks | callback s | s per check | overhead |\n"
        f"|---|---|---|---|---|---|---|\n"
        f"| {args.steps} | {baseline:.1f} | {with_callback:.1f} | {checks} | {callback.seconds:.2f} | "
        f"{callback.seconds / max(checks, 1):.3f} | {share:.1%} |\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    header = "# PlateauStoppingCallback overhead (defaults, tiny CPU GRPO run)\n\n" + provenance(time.perf_counter() - started) + "\n"
    (args.out / "callback_overhead.md").write_text(header + text)
    print(text)


if __name__ == "__main__":
    main()
