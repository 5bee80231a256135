"""A third-party client: EleutherAI's lm-evaluation-harness scores tasks through the server.

Its `local-completions` model (prompts as token ids, `echo` + `logprobs` to score each choice,
`stop` sequences to generate) runs two small local tasks against the real server in float32,
and its `hf` model runs them on the same weights in this process: the accuracies are equal and
every choice's loglikelihood agrees to 1e-3. Nothing is downloaded (the data are in
tests/integration/lm_eval_tasks; datasets' `json` loader reads them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loadtest.server_process import REPO, ServerProcess

from tests.integration.conftest import MODEL

TASKS_DIR = Path(__file__).parent / "lm_eval_tasks"
MODEL_DIR = REPO / ".cache/models/SmolLM2-135M-Instruct"
LOGLIKELIHOOD_TOLERANCE = 1e-3

TASK_YAML = {
    "llmserve_facts_mc": """task: llmserve_facts_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/capitals.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""",
    "llmserve_short_answers": """task: llmserve_short_answers
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}/arithmetic.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n", "."]
  max_gen_toks: 8
  do_sample: false
  temperature: 0.0
filter_list:
  - name: strip
    filter:
      - function: remove_whitespace
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
""",
}


@pytest.fixture(scope="module")
def task_manager(tmp_path_factory: pytest.TempPathFactory, monkeypatch_module: pytest.MonkeyPatch) -> Any:
    from lm_eval.tasks import TaskManager

    include = tmp_path_factory.mktemp("lm_eval_tasks")
    for name, text in TASK_YAML.items():
        (include / f"{name}.yaml").write_text(text.format(data=TASKS_DIR))
    monkeypatch_module.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch_module.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("datasets")))
    return TaskManager(include_path=str(include))


@pytest.fixture(scope="module")
def monkeypatch_module() -> Any:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def evaluate(task_manager: Any, model: str, model_args: dict[str, Any]) -> dict[str, Any]:
    import lm_eval

    results: dict[str, Any] = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=list(TASK_YAML),
        task_manager=task_manager,
        log_samples=True,
    )
    return results


def test_lm_eval_through_the_server_matches_lm_eval_on_the_same_weights(
    fp32_server: ServerProcess, task_manager: Any
) -> None:
    served = evaluate(
        task_manager,
        "local-completions",
        {
            "model": MODEL,
            "base_url": f"{fp32_server.base_url}/v1/completions",
            "tokenizer": str(MODEL_DIR),
            "tokenizer_backend": "huggingface",
            "num_concurrent": 1,
            "max_retries": 1,
        },
    )
    local = evaluate(task_manager, "hf", {"pretrained": str(MODEL_DIR), "dtype": "float32", "device": "cpu"})

    for task, metric in (("llmserve_facts_mc", "acc,none"), ("llmserve_short_answers", "exact_match,strip")):
        assert served["results"][task][metric] == local["results"][task][metric], task
    assert served["results"]["llmserve_facts_mc"]["acc,none"] >= 0.5, "the model knows most of these"

    served_mc = served["samples"]["llmserve_facts_mc"]
    local_mc = local["samples"]["llmserve_facts_mc"]
    assert len(served_mc) == len(local_mc) == 12
    differences = [
        abs(mine[0] - theirs[0])
        for ours, reference in zip(served_mc, local_mc, strict=True)
        for mine, theirs in zip(ours["filtered_resps"], reference["filtered_resps"], strict=True)
    ]
    print(f"\nlm-eval: {len(differences)} choice loglikelihoods, largest difference {max(differences):.2e}")
    assert max(differences) < LOGLIKELIHOOD_TOLERANCE

    answers = [sample["filtered_resps"][0] for sample in served["samples"]["llmserve_short_answers"]]
    reference_answers = [sample["filtered_resps"][0] for sample in local["samples"]["llmserve_short_answers"]]
    assert answers == reference_answers, "greedy answers through the server equal transformers' in float32"
