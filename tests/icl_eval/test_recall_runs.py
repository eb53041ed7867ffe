"""`evalm eval recall` runs: the shared-prefix trie against prompts encoded alone, a perfect reader end to
end, the window's cut, resume by unit, and every bad input as one line before any work.

    python -m pytest tests/icl_eval/test_recall_runs.py -q

Oracles: `decoding.generate` on each prompt alone (a fresh cache per prompt) for the trie, on a real
EVALM (EVA, forks mid-block) and a real Hugging Face GPT-2; `Reader`, written here, answers every
family from the text it was given as the family's paper defines the task, so a correct pipeline
scores 1 with it and exactly the needles the window cut score 0.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evalm import ModelConfig
from evalm.icl_eval.models.decoding import GenerationSettings, generate
from evalm.icl_eval.models.lm import EvalmLM
from evalm.icl_eval.protocol.units import without_execution
from evalm.icl_eval.recall import scoring
from evalm.icl_eval.recall.config import FAMILIES, RecallConfig
from evalm.icl_eval.recall.encoding import answer_all
from evalm.icl_eval.recall.haystacks import Haystacks
from evalm.icl_eval.recall.report import results
from evalm.icl_eval.recall.runner import Runner
from evalm.text.tokenizer import ByteTokenizer
from tests import models
from tests.icl_eval.test_recall_families import prompts_of

REPO = Path(__file__).resolve().parents[2]


class Reader:
    """A `CausalLM` that reads perfectly: its cache is the bytes read, and its next byte is the next one of
    the answer the text's last question asks, derived from the text alone, then a line break; where the
    text lacks what the question needs, eos. Holds no more than `window` tokens when it has one."""

    name, device = "reader", torch.device("cpu")

    def __init__(self, window: int | None = None):
        self.tokenizer, self.max_positions = ByteTokenizer(), window

    def new_state(self, position_offset: int = 0):
        return {"tokens": []}

    def fork(self, state, batch_size: int = 1):
        return {"tokens": list(state["tokens"])}

    def extend(self, state, tokens: torch.Tensor) -> torch.Tensor:
        state["tokens"] += tokens[0].tolist()
        assert self.max_positions is None or len(state["tokens"]) <= self.max_positions
        logits = torch.zeros(1, tokens.shape[1], 257)
        logits[0, -1, _next_byte(self.tokenizer.decode(state["tokens"]))] = 1.0
        return logits


def _next_byte(text: str) -> int:
    for ask, answer in ((r"The pass key is", _passkey), (r"mentioned in the provided text (?:is|are)", _needles),
                        (r"they are:", _chain), (r"Corresponding value:", _json), (r"\nQueries:(?: \w+ \d\d)* \w+", _mqar)):
        found = list(re.finditer(ask, text))
        if found and (ask != "The pass key is" or "What is the pass key?" in text[found[-1].start() - 25 :]):
            end = found[-1].end()
            try:
                gold = answer(text[:end]) + "\n"
            except (KeyError, IndexError, ValueError):  # what the question needs is not in the text
                return 256
            made = text[end:]
            return gold.encode()[len(made.encode())] if gold.startswith(made) and len(made) < len(gold) else 256
    return 256


def _passkey(text: str) -> str:
    return " " + re.findall(r"The pass key is (\d+)\. Remember it", text)[-1]


def _needles(text: str) -> str:
    keys = re.split(r", | and ", re.findall(r"numbers? for (.+?) mentioned", text)[-1])
    values = [v for k in keys for v in re.findall(rf"numbers for {re.escape(k)} is: (\d+)\.", text)]
    return " " + ", ".join(values) if values else values[0]


def _chain(text: str) -> str:
    value = re.findall(r"assigned the value (\d+),", text)[-1]
    names, frontier = [], [value]
    while frontier:
        target = frontier.pop()
        for name in re.findall(rf"VAR ([A-Z]{{5}}) = (?:VAR )?{target}\.", text):
            names.append(name)
            frontier.append(name)
    return " " + " ".join(names) if names else names[0]


def _json(text: str) -> str:
    key = re.findall(r'Key: "([0-9a-f-]+)"', text)[-1]
    return " " + json.loads(re.search(r"JSON data: (\{.*?\})", text).group(1))[key]


def _mqar(text: str) -> str:
    context, _, queries = text.rpartition("\nQueries:")
    pairs = dict(re.findall(r"(\w+) (\d\d)\b", context))
    return " " + pairs[queries.split()[-1]]


def run_grid(lm, config: RecallConfig, window: int | None = None) -> dict:
    runner = Runner(lm, config, (256,), Haystacks(lm.tokenizer), window)
    return results([runner.run_unit(u) for u in runner.units()], config, {})


def test_a_perfect_reader_scores_one_in_every_cell_of_every_family():
    config = RecallConfig(lengths=(1500,), depths=(0, 50, 100), seeds=(1, 2), items=2, mqar_pairs=6)
    out = run_grid(Reader(), config)
    assert [(c["task"], c["accuracy"]) for c in out["cells"]] == [(t, 1.0) for t in FAMILIES for _ in range(3)]
    assert all(c["tokens"] <= 1500 and c["chance"] < 0.02 for c in out["cells"])
    for row in out["cost"]:  # every depth's haystack before its needle encoded once
        assert row["tokens_encoded_per_item"] < row["tokens_prompted_per_item"]


def test_the_window_cut_loses_exactly_the_needles_it_drops():
    """drop_left past a 700-token window: the reader sees the last 700 tokens, so depth 0's needle is gone
    (score 0) and depth 100's stays (score 1), and the records say which."""
    config = RecallConfig(tasks=("passkey", "niah_single"), lengths=(1500,), depths=(0, 100), seeds=(1,), items=3,
                          overflow="drop_left")
    out = run_grid(Reader(window=700), config, window=700)
    scores = {(c["task"], c["depth"]): (c["accuracy"], c["needle_lost"]) for c in out["cells"]}
    assert scores == {("passkey", 0): (0.0, 3), ("passkey", 100): (1.0, 0),
                      ("niah_single", 0): (0.0, 3), ("niah_single", 100): (1.0, 0)}
    assert all(c["tokens_range"][1] <= 700 - 18 for c in out["cells"])  # room for the answer: 2 x 7 + 4 tokens


def visible_eva() -> EvalmLM:
    config = ModelConfig(vocab_size=257, d_model=16, n_layer=2, n_head=2, d_ff=32, window_size=8, chunk_size=4,
                         circular_period=512, dropout=0.0, attn_dropout=0.0)
    return EvalmLM(models.visible_model(config).double(), ByteTokenizer())


@pytest.mark.parametrize("family", ["niah_multikey", "mqar"])
def test_the_trie_answers_what_each_prompt_encoded_alone_answers(family):
    """Every depth and (mqar) every query through one trie of forks equals a fresh cache per prompt, and
    encodes each distinct prefix once (the trie's size, counted here)."""
    lm = visible_eva()
    _, enc, placed, _ = prompts_of(family, 700, [0, 30, 30, 100], RecallConfig(mqar_pairs=4))
    prompts = [p for d in placed for p in d.prompts]
    budgets = [6] * len(prompts)
    stop = lambda ids: scoring.ends_answer(lm.tokenizer.decode(ids))  # noqa: E731
    shared, cost = answer_all(lm, prompts, budgets, segment_tokens=64, stop=stop)
    alone = [generate(lm, p, GenerationSettings(6), stop, segment_tokens=64) for p in prompts]
    assert shared == alone and any(alone)
    assert cost.encoded == len({p[:k] for p in prompts for k in range(1, len(p) + 1)}) < cost.prompted


def test_the_trie_on_a_hugging_face_model(tmp_path):
    from evalm.icl_eval.models.hf import load_hf

    lm = load_hf(models.hf_causal_lm(tmp_path / "gpt2"), dtype="float64")
    _, _, placed, _ = prompts_of("passkey", 600, [0, 50, 100], tokenizer=lm.tokenizer)
    prompts = [d.prompts[0] for d in placed]
    shared, cost = answer_all(lm, prompts, [5] * 3, 128, lambda ids: False)
    assert shared == [generate(lm, p, GenerationSettings(5), segment_tokens=128) for p in prompts] and cost.encoded < cost.prompted


# ---------------------------------------------------------------------------------------------------------
# The command: resume, bad inputs
def evalm(*args: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalm.launcher.cli", "eval", "recall", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


SMALL = ["--tasks", "passkey,mqar", "--lengths", "700", "--depths", "0,100", "--seeds", "1,2", "--items", "1",
         "--recall.mqar_pairs=4"]


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory) -> Path:
    return models.byte_model(tmp_path_factory.mktemp("byte") / "model")


@pytest.mark.slow  # ~14 s on 2 cores
def test_a_run_resumes_its_finished_units_and_refuses_other_settings(byte_model, tmp_path):
    out = tmp_path / "out"
    first = evalm("--checkpoint", str(byte_model), *SMALL, out=out)
    assert first.returncode == 0, first.stderr
    before = json.loads((out / "results.json").read_text())
    assert [(c["task"], c["length"], c["depth"]) for c in before["cells"]] == \
        [(t, 700, d) for t in ("passkey", "mqar") for d in (0, 100)]
    assert {"task", "length", "depth", "accuracy", "chance", "tokens"} <= set(before["cells"][0])
    assert before["model_options"] == {"device": "cpu", "dtype": "float32", "context_window": None, "eva_ablation": "none"}
    (out / "units" / "00002-mqar-700-seed1.npz").unlink()
    again = evalm("--checkpoint", str(byte_model), *SMALL, out=out)
    assert again.returncode == 0, again.stderr
    after = json.loads((out / "results.json").read_text())
    assert after["execution"] == {"ranks": 1, "units": 4, "units_resumed": 3, "units_computed": 1}
    assert without_execution(after) == without_execution(before)
    other = evalm("--checkpoint", str(byte_model), *SMALL[:-1], "--recall.mqar_pairs=5", out=out)
    assert other.returncode == 2 and "other settings" in other.stderr and "mqar_pairs" in other.stderr


def one_line_refusal(result: subprocess.CompletedProcess, out: Path, words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr
    assert "Traceback" not in result.stderr and not (out / "units").exists()  # refused before any work


def refused_here(args: list[str], out: Path, capfd) -> subprocess.CompletedProcess:
    """`evalm eval recall ARGS` in this process (no interpreter and torch to start), stderr read at the
    file descriptor, so that anything else written there (a warning, a log line) counts as a second line."""
    from evalm.launcher.cli import main

    capfd.readouterr()
    try:
        code = main(["eval", "recall", *args, "--out", str(out)])
    except SystemExit as stop:
        code = stop.code
    return subprocess.CompletedProcess(args, code, "", capfd.readouterr().err)


def test_every_bad_input_is_one_line_before_any_work(byte_model, tmp_path, capfd):
    """The first refusal through the installed entry point as a user starts it; the others in this process."""
    (tmp_path / "short.txt").write_text("A book of two sentences. It ends here.")
    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text(json.dumps({"model_type": "t5", "is_encoder_decoder": True}))
    model = ["--checkpoint", str(byte_model)]
    for i, (args, words) in enumerate((
            ([*model, "--tasks", "passkey,needles"], "unknown name(s) needles"),
            ([*model, "--depths", "0,120"], "give values from 0 to 100"),
            ([*model, "--tasks", "kv_recall", "--lengths", "400"], "a kv_recall prompt needs"),
            (["--hf-model", str(t5), "--tasks", "passkey"], "encoder-decoder (T5) cannot generate"),
            ([*model, "--tasks", "passkey", "--lengths", "1000", "--recall.context_window=600"], "window of 600"),
            ([*model, "--tasks", "niah_single", "--lengths", "1000", "--haystack", "books"], "needs --books"),
            ([*model, "--tasks", "niah_single", "--lengths", "9000", "--haystack", "books", "--books",
              str(tmp_path / "short.txt")], "give more books or lower --lengths"))):
        out = tmp_path / f"out{i}"
        one_line_refusal(evalm(*args, out=out) if i == 0 else refused_here(args, out, capfd), out, words)


def test_the_eva_ablation_reaches_every_eva_layer_and_every_cell(byte_model, tmp_path):
    """`--eva-ablation` is recorded in model_options, every cell and every record; the loaded model's
    layers carry it (tests/evalm/test_eva_ablation.py proves what it then computes); a model with no
    EVA layer is refused in one line before any unit."""
    from evalm.icl_eval.models.source import LoadOptions, ModelSource
    from evalm.icl_eval.recall.command import load
    from evalm.io import save_model
    from evalm.tiling import Ablation

    out = tmp_path / "out"
    run = evalm("--checkpoint", str(byte_model), *SMALL, "--eva-ablation", "chunk-window", out=out)
    assert run.returncode == 0, run.stderr
    data = json.loads((out / "results.json").read_text())
    assert data["model_options"]["eva_ablation"] == "chunk-window"
    assert {c["eva_ablation"] for c in data["cells"] + data["records"]} == {"chunk-window"}
    assert data["settings"]["values"]["recall"]["eva_ablation"] == "chunk-window"

    source = ModelSource.of(str(byte_model), None, None, None)
    assert source.kind == "evalm"
    for name in ("none", "no-remote", "chunk-window"):
        options = LoadOptions.of(RecallConfig(eva_ablation=name))
        assert options.eva_ablation == name
        lm = load(source, options, "cpu")
        assert [b.attn.layout.ablation for b in lm.model.blocks] == [Ablation(name)]

    full = save_model(models.visible_model(ModelConfig(vocab_size=257, d_model=16, n_layer=1, n_head=2, d_ff=32,
                                                       attention="full")), tmp_path / "full")
    refused = evalm("--checkpoint", str(full), *SMALL, "--eva-ablation", "no-remote", out=tmp_path / "out2")
    one_line_refusal(refused, tmp_path / "out2", "has no EVA attention layer")


def test_eval_ppl_and_icl_take_the_same_ablation(byte_model, tmp_path, capsys):
    """`--eva-ablation` on `evalm eval ppl`: kept in the settings, and the model it scores is the ablated one
    (each ablation its own perplexity on the same book); `evalm eval icl` refuses it for full attention. The
    progress line counts the tokens scored (256 of the book's 456, in segments of 64), not books."""
    from evalm.icl_eval.cli import main
    from evalm.io import save_model

    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.txt").write_text("a passage of words that repeat, and words that do not. " * 8)
    ppl = {}
    for name in ("none", "no-remote", "chunk-window"):
        out = tmp_path / name
        assert main(["ppl", "--checkpoint", str(byte_model), "--books", str(tmp_path / "books"), "--lengths", "64,256",
                     "--ppl.segment_tokens=64", "--eva-ablation", name, "--out", str(out)]) == 0
        assert "evalm eval ppl: units 1/1 (0 resumed)  256 tokens" in capsys.readouterr().err
        res = json.loads((out / "results.json").read_text())
        assert res["settings"]["values"]["ppl"]["eva_ablation"] == name
        ppl[name] = res["protocols"]["cached"]["overall"]["token_ppl"]
    assert len({round(v, 6) for v in ppl.values()}) == 3, ppl
    full = save_model(models.visible_model(ModelConfig(vocab_size=257, d_model=16, n_layer=1, n_head=2, d_ff=32,
                                                       attention="full")), tmp_path / "full")
    capsys.readouterr()
    assert main(["icl", "--checkpoint", str(full), "--eva-ablation", "no-remote", "--shots", "0", "--seeds", "1",
                 "--out", str(tmp_path / "icl")]) == 2
    assert "has no EVA attention layer" in capsys.readouterr().err
