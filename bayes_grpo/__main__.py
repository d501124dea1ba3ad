"""Allow ``python -m bayes_grpo``."""

from bayes_grpo.cli import main

raise SystemExit(main())
