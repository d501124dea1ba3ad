"""The runs bundled with bayes_grpo (installed as ``bayes_grpo_data`` by a wheel; see ``setup.py``)."""
