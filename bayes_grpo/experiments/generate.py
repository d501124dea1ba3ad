"""Generate one GRPO training run: supervised warm-up, initial-reward eval, TRL GRPO, log.

Usage: ``python -m bayes_grpo.experiments.generate --family llama --size xs --task sort --noise 0.5 --out data/runs``
(or ``bayes-grpo generate ...``).  Writes ``<run_id>.csv`` (one row per GRPO step) and
``<run_id>.meta.json`` into ``--out``. Warm-up prompts and GRPO prompts come from
disjoint halves of the task's prompt space (``tasks.split_of``).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from bayes_grpo.settings import GENERATOR_SOURCE

from . import tasks
from .models import FAMILIES, SIZES, WARMUP_LR, build_model, build_tokenizer, count_params

CSV_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "completions/mean_length",
               "completions/clipped_ratio", "grad_norm", "learning_rate", "loss")
"""TRL metrics written to the CSV when logged (``kl`` only when ``beta > 0``), then ``rewards/<name>/mean``."""
EVAL_SEED = 10_000
"""Seed of the fixed evaluation prompts (from the GRPO split) that measure the initial reward."""


def sig(x: float, digits: int = 5) -> float:
    """Round ``x`` to ``digits`` significant digits."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def run_id(args: argparse.Namespace) -> str:
    """File stem that identifies a run by its settings (recipe options appear when not the default)."""
    digits = tasks.DEFAULT_DIGITS[args.task] if args.digits is None else args.digits
    parts = [args.family, args.size, f"{args.task}{digits}", f"noise{args.noise:g}", f"lr{args.lr:g}"]
    if args.lr_schedule != _DEFAULTS["lr_schedule"]:
        parts.append(args.lr_schedule.replace("_", ""))
    for key, short in (("beta", "beta"), ("num_generations", "g"), ("prompts_per_step", "p"), ("max_steps", "n")):
        if getattr(args, key) != _DEFAULTS[key]:
            parts.append(f"{short}{getattr(args, key):g}")
    return "-".join([*parts, f"s{args.seed}"])


def seed_all(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _encode(tok: Any, prompts: list[str], targets: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``prompt+target+EOS`` ids and labels masked to the target part."""
    seqs, labels = [], []
    for p, t in zip(prompts, targets):
        p_ids = tok(p, add_special_tokens=False)["input_ids"]
        t_ids = tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append(p_ids + t_ids)
        labels.append([-100] * len(p_ids) + t_ids)
    width = max(map(len, seqs))
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
    lab = torch.tensor([s + [-100] * (width - len(s)) for s in labels])
    return ids, lab


def warmup(model: Any, tok: Any, examples: list[tasks.Example], noise: float, clean_steps: int, noisy_steps: int,
           lr: float, batch: int, seed: int) -> float:
    """Supervised warm-up on warm-up-split prompts; returns the last loss.

    ``clean_steps`` on correct answers, then ``noisy_steps`` on answers corrupted with
    probability ``noise`` (AdamW, 50-step linear LR ramp, then constant). The clean phase
    teaches the format and part of the mapping, the noisy phase spreads the policy's mass
    over wrong answers and missing terminators, which sets the initial reward of GRPO.
    """
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 50))
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(clean_steps + noisy_steps):
        p = 0.0 if step < clean_steps else noise
        exs = rng.sample(examples, batch)
        ids, lab = _encode(tok, [e.prompt for e in exs], [tasks.noisy_target(e, p, rng) for e in exs])
        loss = model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long(), labels=lab).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return float(loss.detach())


@torch.no_grad()
def eval_reward(model: Any, tok: Any, examples: list[tasks.Example], samples: int, max_new_tokens: int,
                seed: int, temperature: float = 1.0) -> dict[str, float]:
    """Mean total and per-function reward of sampled completions on a fixed eval batch."""
    torch.manual_seed(seed)
    model.eval()
    prompts = [e.prompt for e in examples for _ in range(samples)]
    answers = [e.answer for e in examples for _ in range(samples)]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                         max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    completions = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    per = {f.__name__: float(np.mean(f(completions, answer=answers))) for f in tasks.REWARD_FUNCS}
    model.train()
    return {"reward": sum(per.values()), **{f"rewards/{k}/mean": v for k, v in per.items()}}


def _hardware() -> str:
    """CPU model name (or platform string when /proc/cpuinfo is missing)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def command_for(args: argparse.Namespace) -> str:
    """Exact shell command that regenerates the run described by ``args``."""
    parts = ["python", "-m", "bayes_grpo.experiments.generate"]
    for key, value in sorted(vars(args).items()):
        if key in ("func", "command", "out"):
            continue
        parts += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(parts + ["--out", str(args.out)])


def generate_run(args: argparse.Namespace) -> Path:
    """Run warm-up and TRL GRPO as described by ``args``; write the CSV and meta.json.

    Parameters
    ----------
    args : argparse.Namespace
        Options of :func:`add_arguments` (family, size, task, warm-up and GRPO recipe, seed, out).

    Returns
    -------
    pathlib.Path
        The written ``<run_id>.csv``.

    Raises
    ------
    ValueError
        Inconsistent options (an unknown task or a non-positive step count).

    Example
    -------
    >>> p = argparse.ArgumentParser(); add_arguments(p)
    >>> generate_run(p.parse_args(["--max-steps", "3", "--out", "/tmp/runs"]))  # doctest: +SKIP
    """
    import transformers
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    if args.max_steps <= 0 or args.prompts_per_step <= 0 or args.num_generations < 2:
        raise ValueError("max_steps and prompts_per_step must be positive and num_generations at least 2")
    if args.digits is None:
        args.digits = tasks.DEFAULT_DIGITS[args.task]
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    seed_all(args.seed)
    t0 = time.time()
    tok = build_tokenizer()
    model = build_model(args.family, args.size, len(tok), args.seed)
    n_params, n_nonemb = count_params(model)
    max_len = tasks.max_answer_length(args.task, args.digits) + 2

    pool = tasks.make_examples(args.task, args.digits, args.warmup_examples, seed=args.seed + 1, split="warmup")
    train = tasks.make_examples(args.task, args.digits, args.prompts, seed=args.seed + 2, split="grpo")
    evalset = tasks.make_examples(args.task, args.digits, args.eval_prompts, seed=EVAL_SEED, split="grpo")
    overlap = len({e.prompt for e in pool} & {e.prompt for e in train + evalset})
    if overlap:
        raise ValueError(f"{overlap} GRPO prompts were also warm-up prompts; the split is broken")
    warm_loss = warmup(model, tok, pool, args.noise, args.clean_steps, args.noisy_steps, args.warmup_lr,
                       args.warmup_batch, args.seed)
    init = eval_reward(model, tok, evalset, args.eval_samples, max_len, seed=args.seed)
    t_warm = time.time() - t0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = run_id(args)
    tmp = tempfile.mkdtemp(prefix="bayes_grpo_trainer_")  # trainer scratch, deleted after the run
    if args.beta > 0:  # TRL builds the KL reference from the config's path: point it at the warmed-up policy
        model.save_pretrained(Path(tmp) / "reference")
        model.config._name_or_path = str(Path(tmp) / "reference")
    config = GRPOConfig(
        output_dir=tmp, use_cpu=True, bf16=False, fp16=False,
        learning_rate=args.lr, lr_scheduler_type=args.lr_schedule,
        warmup_steps=round(args.lr_warmup * args.max_steps) if args.lr_schedule != "constant" else 0,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations, max_completion_length=max_len, temperature=1.0, top_k=0,
        max_steps=args.max_steps, logging_steps=1, report_to="none", save_strategy="no", seed=args.seed,
        data_seed=args.seed, beta=args.beta, loss_type="dapo", dataloader_num_workers=0, disable_tqdm=True,
    )
    dataset = Dataset.from_list([{"prompt": e.prompt, "answer": e.answer} for e in train])
    trainer = GRPOTrainer(model=model, reward_funcs=list(tasks.REWARD_FUNCS), args=config, train_dataset=dataset,
                          processing_class=tok)
    trainer.remove_callback(PrinterCallback)
    t1 = time.time()
    trainer.train()
    t_grpo = time.time() - t1
    shutil.rmtree(tmp, ignore_errors=True)
    total_steps = int(trainer.state.global_step)
    steps_per_epoch = math.ceil(args.prompts / args.prompts_per_step)

    rows = [h for h in trainer.state.log_history if "reward" in h and "step" in h]
    cols = ["step", *(c for c in CSV_METRICS if c in rows[0]),
            *sorted(c for c in rows[0] if c.startswith("rewards/") and c.endswith("/mean"))]
    df = pd.DataFrame([{c: r.get(c, np.nan) for c in cols} for r in rows])
    for c in cols[1:]:
        df[c] = df[c].astype(float).map(sig)
    df["family"], df["params_b"], df["total_steps"] = args.family, sig(n_params / 1e9), total_steps
    df.to_csv(out / f"{stem}.csv", index=False)

    meta = {
        "family": args.family, "architecture": type(model.config).__name__, "size": args.size,
        "n_params": n_params, "n_params_non_embedding": n_nonemb, "params_b": sig(n_params / 1e9),
        "task": f"{args.task}-{args.digits}digit",
        "reward_functions": {f.__name__: f.__doc__ for f in tasks.REWARD_FUNCS},
        "reward_range": list(tasks.REWARD_RANGE), "initial_reward": sig(init["reward"]),
        "initial_rewards": {k: sig(v) for k, v in init.items() if k != "reward"},
        "initial_reward_eval": {"prompts": args.eval_prompts, "samples_per_prompt": args.eval_samples,
                                "temperature": 1.0, "eval_seed": EVAL_SEED, "split": "grpo"},
        "steps_per_epoch": steps_per_epoch, "total_steps": total_steps, "max_steps": args.max_steps,
        "prompts": {"split_rule": "tasks.split_of: SHA-256 of the prompt text, first byte parity",
                    "grpo_prompts": args.prompts, "grpo_unique": len({e.prompt for e in train}),
                    "warmup_unique": len({e.prompt for e in pool}), "shared_with_warmup": overlap},
        "seeds": {"run": args.seed, "warmup_data": args.seed + 1, "grpo_prompts": args.seed + 2,
                  "eval_prompts": EVAL_SEED},
        "warmup": {"clean_steps": args.clean_steps, "noisy_steps": args.noisy_steps, "label_noise": args.noise,
                   "lr": args.warmup_lr, "batch": args.warmup_batch, "examples": args.warmup_examples,
                   "final_loss": sig(warm_loss)},
        "hyperparameters": {"learning_rate": args.lr, "lr_scheduler_type": args.lr_schedule,
                            "warmup_steps": config.warmup_steps, "beta": config.beta,
                            "prompts_per_step": args.prompts_per_step, "num_generations": args.num_generations,
                            "per_device_train_batch_size": config.per_device_train_batch_size,
                            "max_completion_length": max_len, "temperature": 1.0, "loss_type": config.loss_type,
                            "epsilon": config.epsilon, "scale_rewards": config.scale_rewards,
                            "num_iterations": config.num_iterations, "optimizer": str(config.optim)},
        "versions": {"torch": torch.__version__, "trl": trl.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "hardware": f"CPU: {_hardware()} ({args.threads} thread)",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "wall_time_s": sig(time.time() - t0), "warmup_time_s": sig(t_warm), "grpo_time_s": sig(t_grpo),
        "s_per_step": sig(t_grpo / max(total_steps, 1)),
        "source": "bayes_grpo.experiments.generate", "source_repo": f"{GENERATOR_SOURCE}/{args.task}",
        "generator": GENERATOR_SOURCE, "synthetic": True, "command": command_for(args),
    }
    (out / f"{stem}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out / f"{stem}.csv"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the generator's options to ``p``.

    Parameters
    ----------
    p : argparse.ArgumentParser
        Parser to extend.

    Example
    -------
    >>> p = argparse.ArgumentParser(); add_arguments(p); p.parse_args([]).task
    'reverse'
    """
    p.add_argument("--family", choices=FAMILIES, default="llama")
    p.add_argument("--size", choices=list(SIZES), default="xs")
    p.add_argument("--task", choices=sorted(tasks.TASKS), default="reverse")
    p.add_argument("--digits", type=int, default=None, help="input length (default: tasks.DEFAULT_DIGITS[task])")
    p.add_argument("--noise", type=float, default=0.5, help="label-noise probability of the noisy warm-up phase")
    p.add_argument("--clean-steps", type=int, default=120, help="warm-up steps on correct answers")
    p.add_argument("--noisy-steps", type=int, default=40, help="warm-up steps on noisy answers")
    p.add_argument("--warmup-lr", type=float, default=WARMUP_LR, help="warm-up learning rate (same for every size)")
    p.add_argument("--warmup-batch", type=int, default=32)
    p.add_argument("--warmup-examples", type=int, default=3000)
    p.add_argument("--lr", type=float, default=3e-4, help="GRPO peak learning rate")
    p.add_argument("--lr-schedule", choices=("constant", "constant_with_warmup", "cosine", "linear"),
                   default="constant_with_warmup")
    p.add_argument("--lr-warmup", type=float, default=0.1,
                   help="LR warm-up as a fraction of --max-steps (schedules other than constant)")
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient")
    p.add_argument("--max-steps", type=int, default=300, help="GRPO steps")
    p.add_argument("--prompts", type=int, default=1000, help="GRPO prompts drawn from the GRPO split (repeats allowed)")
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--eval-prompts", type=int, default=32)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="data/runs")


def _defaults() -> dict[str, Any]:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return vars(p.parse_args([]))


_DEFAULTS = _defaults()


def add_generate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``generate`` sub-command on a CLI's ``subparsers``."""
    p = subparsers.add_parser("generate", help="generate one bundled GRPO training run", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run_generate)
    return p


def run_generate(args: argparse.Namespace) -> int:
    """CLI entry: generate the run and print the CSV path; returns the exit code."""
    print(generate_run(args))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m bayes_grpo.experiments.generate`` entry point."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run_generate(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
