"""configs/study-summaries.toml, the GPU study of whether EVA's summaries carry a converted model's long-range
attention, run end to end on a tiny Llama on the CPU: the shipped file itself, its scale set by `[study.vars]`.

    pytest tests/train/test_study_summaries.py

Every stage runs (prepare, tokens, convert, probes, transfer, LoRA and its window-only control, trainables,
perplexity, recall, ICL, each reading with and without the summaries, the summary); what each writes is checked
where an oracle exists here: the probes and the ablations read the same lines, the control's maps never move,
the summary's figures are the stages' own files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")

from evalm.launcher.cli import main as evalm  # noqa: E402
from tests.train.llama_helpers import tiny_llama_folder  # noqa: E402

STUDY = Path(__file__).resolve().parents[2] / "configs" / "study-summaries.toml"
VOCAB = 64


def word_tokenizer():
    """Words t0 … t60, the digits 0 and 1 (the integer labels of the ICL step) and SmolLM2's eos, as ids 0 … 63."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {**{f"t{i}": i for i in range(61)}, "0": 61, "1": 62, "<|endoftext|>": 63}
    backend = Tokenizer(models.WordLevel(words, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>", unk_token="t0")


def inputs(root: Path) -> dict[str, str]:
    """A tiny Llama, documents, a book and a two-label task in its words: the vars that scale the study down."""
    rng = np.random.default_rng(0)
    source = tiny_llama_folder(root / "llama", dtype="float32")
    word_tokenizer().save_pretrained(source)
    docs = root / "docs"
    docs.mkdir()
    with open(docs / "a.jsonl", "w") as f:
        for _ in range(40):
            f.write(json.dumps({"text": " ".join(f"t{i}" for i in rng.integers(1, 61, 200))}) + "\n")
    book = root / "book.txt"
    book.write_text(" ".join(f"t{i}" for i in rng.integers(1, 61, 700)))
    from evalm.icl_eval.tasks.folder import write_task_folder
    from evalm.icl_eval.tasks.task import Task

    rows = {split: [{"text": " ".join(f"t{i}" for i in rng.integers(1, 61, 3)), "label": int(j % 2)} for j in range(n)]
            for split, n in (("train", 40), ("test", 6))}
    task_file, _ = write_task_folder(root / "task", Task("pairs", "{text} {label}", ("t1", "t2")), rows)
    return {"source": str(source), "corpus": str(docs), "window": "8", "chunk": "4", "seq_len": "32",
            "transfer_steps": "3", "transfer_batch": "2", "lora_len": "64", "lora_steps": "2", "precision": "fp32",
            "probe_lines": "2", "books": str(book), "ppl_lengths": "64,128,256", "ppl_tokens": "256",
            "recall_lengths": "128,256", "recall_items": "1", "icl_task": str(task_file), "icl_shots": "0,4",
            "icl_items": "2"}


@pytest.mark.slow
def test_the_summaries_study_runs_end_to_end_on_a_tiny_llama(tmp_path, capsys):
    root = tmp_path / "study"
    sets = [x for k, v in inputs(tmp_path).items() for x in ("--set", f"study.vars.{k}={json.dumps(v)}")]
    assert evalm(["run", "--config", str(STUDY), "--root", str(root), *sets]) == 0, capsys.readouterr().err[-3000:]
    probe = {stage: json.loads((root / "probe" / stage / "probe.json").read_text()) for stage in ("eva-0", "transfer")}
    assert probe["eva-0"]["buckets"] == [[8, 16], [16, 32]]
    # the original's attention is the same weights' in both probes: transfer moves A_q/A_k only
    assert probe["eva-0"]["layers"][0]["outside"] == pytest.approx(probe["transfer"]["layers"][0]["outside"], rel=1e-5)
    trainables = root / "lora" / "trainables.safetensors"
    summary = (root / "summary.md").read_text()
    assert hashlib.sha256(trainables.read_bytes()).hexdigest() in summary
    for model in ("original", "eva-0", "eva-0-off", "lora", "lora-off", "window"):  # each row is its own file's
        buckets = json.loads((root / "ppl" / model / "results.json").read_text())["protocols"]["cached"]["buckets"]
        assert f"| {model} | " + " | ".join(f"{b['token_ppl']:.1f}" for b in buckets) + " |" in summary, model
    assert "| (uniform) | 64.0 | 64.0 | 64.0 |" in summary and "| (unigram) |" in summary
    off = json.loads((root / "recall" / "lora-off" / "results.json").read_text())["cells"]
    assert {c["eva_ablation"] for c in off} == {"no-remote"}  # the summaries-off reading is what it says
    assert "unmeasured (no ppl lora -32" in summary  # no [16, 32) bucket at this scale: said, not guessed


def test_the_shipped_scale_is_the_issues():
    """At its shipped vars the study transfers on >= 20M tokens of lines at SmolLM2's trained length, LoRA reads
    16k lines, perplexity reaches 131,072 tokens, ICL 1,024 shots, and every evaluation of an EVA model has its
    summaries-off twin (the proof the study rests on)."""
    from evalm.launcher.study_file import load_study

    study = load_study(STUDY)
    v = study.section.vars
    assert int(v["transfer_steps"]) * int(v["transfer_batch"]) * int(v["seq_len"]) >= 20_000_000
    assert int(v["seq_len"]) == 8192 and int(v["lora_len"]) == 16384 and int(v["ppl_tokens"]) == 131072
    assert v["icl_shots"].split(",")[-1] == "1024"
    names = study.names()
    for kind in ("ppl", "recall", "icl"):
        assert f"{kind}-lora-off" in names and f"{kind}-lora" in names
        assert "no-remote" in study.step(f"{kind}-lora-off").argv
    assert "uptrain.eva_ablation=\"no-remote\"" in study.step("lora-window").argv
