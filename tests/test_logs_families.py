"""Family and size from model names: the names people use, and properties of the parser."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bayes_grpo.logs import infer_model, normalise_family
from bayes_grpo.logs.families import model_names_in_text


@pytest.mark.parametrize(
    ("name", "family", "params_b"),
    [
        ("unsloth/Qwen2.5-1.5B-Instruct", "qwen", 1.5),
        ("Qwen/Qwen2.5-0.5B-Instruct", "qwen", 0.5),
        ("Qwen/Qwen2.5-7B", "qwen", 7.0),
        ("qwen2.5-math-1.5b", "qwen", 1.5),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm", 0.135),
        ("HuggingFaceTB/SmolLM2-360M", "smollm", 0.36),
        ("openai/gpt-oss-20b", "gpt-oss", 20.0),
        ("unsloth/gpt-oss-20b-unsloth-bnb-4bit", "gpt-oss", 20.0),
        ("meta-llama/Llama-3.2-3B", "llama", 3.0),
        ("unsloth/Meta-Llama-3.1-8B-Instruct-bnb-4bit", "llama", 8.0),
        ("google/gemma-2-2b", "gemma", 2.0),
        ("microsoft/Phi-3-mini-4k-instruct", "phi", None),
        ("Phi-3-mini", "phi", None),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "qwen", 1.5),
        ("EleutherAI/pythia-70m", "gpt-neox", 0.07),
        ("mistralai/Mixtral-8x7B-v0.1", "mistral", None),
        ("Qwen/Qwen3-30B-A3B", "qwen", 30.0),
        ("models--Qwen--Qwen2.5-0.5B-Instruct", "qwen", 0.5),
        ("/content/outputs/checkpoint-100", None, None),
        ("my-finetune-7b", None, 7.0),
    ],
)
def test_infer_model(name, family, params_b):
    assert infer_model(name) == (family, params_b)


def test_model_names_in_notebook_code_and_printouts():
    code = 'model, tokenizer = FastLanguageModel.from_pretrained(\n    model_name = "unsloth/Qwen2.5-1.5B-Instruct",\n)'
    assert model_names_in_text(code) == ["unsloth/Qwen2.5-1.5B-Instruct"]
    assert model_names_in_text('AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B")') == ["meta-llama/Llama-3.2-1B"]
    assert model_names_in_text("==((====))==  Unsloth 2025.3.19: Fast Llama patching. Transformers: 4.50.0.") == ["Llama"]
    printed = "{'loss': '0.1', 'rewards/qwen_judge/mean': '0.5', 'reward': '0.5'}\n/usr/lib/python3/models/llama/x.py:3"
    assert model_names_in_text(printed) == []  # metric names and file paths do not name the model


FAMILY_SPELLINGS = {
    "qwen": ["Qwen2.5", "Qwen3", "qwen2"], "llama": ["Llama-3.2", "Meta-Llama-3.1", "llama"],
    "gemma": ["gemma-2", "Gemma-3"], "phi": ["Phi-3", "phi-4"], "gpt-oss": ["gpt-oss"], "smollm": ["SmolLM2"],
    "mistral": ["Mistral"], "olmo": ["OLMo-2"],
}  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    family=st.sampled_from(sorted(FAMILY_SPELLINGS)),
    data=st.data(),
    org=st.sampled_from(["", "unsloth/", "Qwen/", "meta-llama/", "my-org/"]),
    size=st.one_of(st.integers(1, 999).map(str), st.tuples(st.integers(0, 99), st.integers(1, 9)).map(lambda t: f"{t[0]}.{t[1]}")),
    unit=st.sampled_from(["B", "b", "M", "m"]),
    suffix=st.sampled_from(["", "-Instruct", "-it", "-bnb-4bit", "-Instruct-unsloth-bnb-4bit", "-GRPO"]),
)
def test_infer_model_recovers_family_and_size(family, data, org, size, unit, suffix):
    spelling = data.draw(st.sampled_from(FAMILY_SPELLINGS[family]))
    name = f"{org}{spelling}-{size}{unit}{suffix}"
    expected = float(size) if unit in "Bb" else float(size) / 1000
    assert infer_model(name) == (family, expected)
    assert normalise_family(family) == family
    code = f'model, tok = FastLanguageModel.from_pretrained(model_name = "{name}", load_in_4bit = True)'
    assert model_names_in_text(code)[0] == name


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_infer_model_never_fails(text):
    family, size = infer_model(text)
    assert family is None or family == normalise_family(family)
    assert size is None or size > 0
    assert all(infer_model(n)[0] is not None for n in model_names_in_text(text))
