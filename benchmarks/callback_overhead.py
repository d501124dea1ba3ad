"""Overhead of PlateauStoppingCallback as a share of training time, in a real tiny GRPOTrainer run.

Trains the same tiny CPU GRPO run (2-layer Llama from a config, local char
tokenizer; see tests/fixtures/make_trl_fixture.py), reporting to TensorBoard,
three times: without the callback, with it at its default check schedule and
plots off, and with plots on (a fan chart to TensorBoard at every check). The
callback never stops (tolerance 0 gives probability 0), so every run does every
step. It reports, as shares of the callback-free training time:

* the time training waits inside the callback (its checks, and with plots the
  hand-over of each figure to the plotting thread);
* the plotting thread's time (drawing and writing the figures: work moved off the
  training loop, which costs training time only where the cores are busy);
* the difference in wall-clock training time, plots on against plots off.

Tiny CPU steps (one torch thread) are far faster than real GRPO steps, so these
are upper bounds on the overhead of a real run. On a shared machine the
wall-clock difference is noisy: the load average before and after is written
beside the figures.

Usage::

    python benchmarks/callback_overhead.py [--model DIR] [--steps 100]

Writes ``benchmarks/results/callback_overhead.md`` with the command. The
trainings run one after the other in this process: a parallel engine would
distort the timings.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from common import RESULTS, markdown, package_code, provenance, verdict
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, set_seed
from trl import GRPOConfig, GRPOTrainer

import bayes_grpo as bg
from bayes_grpo.callback import PlateauStoppingCallback

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_trl_fixture", ROOT / "tests" / "fixtures" / "make_trl_fixture.py")
_fixture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixture)  # type: ignore[union-attr]


#: The target: overhead with plots on below this share of training time.
TARGET = 0.05


class _TimedCallback(PlateauStoppingCallback):
    """The callback, with the wall time of every on_log accumulated (the plotting thread's time is ``plot_seconds``)."""

    seconds = 0.0

    def on_log(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        super().on_log(*args, **kwargs)
        self.seconds += time.perf_counter() - start


def _train(steps: int, callbacks: list) -> float:
    set_seed(0)
    torch.manual_seed(0)
    # One torch thread: on a shared machine, torch's threads spinning against other jobs made the
    # tiny step 50 times slower (3.9 s instead of 0.07 s), which hid the callback's cost.
    torch.set_num_threads(1)
    tokenizer = _fixture.build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=8, num_generations=4,
            max_completion_length=16, learning_rate=1e-3, logging_steps=1, save_strategy="no",
            use_cpu=True, bf16=False, seed=0, disable_tqdm=True, report_to=["tensorboard"],
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
    load_before = os.getloadavg()[0]
    model = bg.load_model(args.model) if args.model else bg.default_model()
    baseline = _train(args.steps, [])
    rows = []
    for plots in (False, True):
        callback = _TimedCallback(model, tolerance=0.0, verbose=False, plots=plots)
        train_seconds = _train(args.steps, [callback])
        checks = len(callback.decisions)
        rows.append({
            "plots": "on" if plots else "off", "steps": args.steps, "train s (no callback)": baseline, "train s": train_seconds,
            "checks": checks, "figures": len(callback.plot_steps), "training waits s": callback.seconds,
            "s per check": callback.seconds / max(checks, 1), "plot thread s": callback.plot_seconds,
            "waits / training": callback.seconds / baseline, "plot thread / training": callback.plot_seconds / baseline,
        })  # fmt: skip
    off, on = rows
    wall = (on["train s"] - off["train s"]) / off["train s"]
    plot_wait = (on["training waits s"] - off["training waits s"]) / baseline
    load_after = os.getloadavg()[0]
    table = pd.DataFrame(rows)
    text = (
        markdown(table, digits=3)
        + f"\nLoad average (1 min) {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} cores.\n\n"
        + f"## Target: overhead with plots under {TARGET:.0%} of training time\n\n"
        + "| measure | share of training time | target |\n|---|---|---|\n"
        + f"| training waits inside the callback, plots on (checks and plots) | {on['waits / training']:.1%} | {verdict(on['waits / training'] < TARGET)} |\n"
        + f"| of which the plots (waits, plots on minus plots off) | {plot_wait:.1%} | {verdict(plot_wait < TARGET)} |\n"
        + f"| plotting thread's time (off the training loop) | {on['plot thread / training']:.1%} | {verdict(on['plot thread / training'] < TARGET)} |\n"
        + f"| wall-clock training time, plots on against plots off | {wall:+.1%} | {verdict(wall < TARGET)} |\n"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    header = (
        "# PlateauStoppingCallback overhead (defaults, tiny CPU GRPO run reporting to TensorBoard)\n\n"
        + provenance(time.perf_counter() - started)
        + f"Package code: {package_code()}.\n\n"
    )
    (args.out / "callback_overhead.md").write_text(header + text)
    print(text)


if __name__ == "__main__":
    main()
