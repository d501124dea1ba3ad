"""Package layout that ``pyproject.toml`` cannot express: ship the repository's ``data/`` folder.

Everything else (metadata, dependencies, package data) is in ``pyproject.toml``.
The bundled runs stay in the top-level ``data/`` folder of the repository; the
wheel installs that folder as the package ``bayes_grpo_data``, where
``bayes_grpo.settings.bundled_runs_dir()`` finds it outside a checkout.
``find_packages`` keeps every ``bayes_grpo`` subpackage in the wheel without
listing them by hand.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["bayes_grpo", "bayes_grpo.*"]) + ["bayes_grpo_data"],
    package_dir={"bayes_grpo_data": "data"},
)
