"""Generator of the bundled GRPO training runs (tasks, tiny models, TRL runner, sweep)."""
