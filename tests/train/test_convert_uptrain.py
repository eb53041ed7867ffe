"""`evalm train uptrain` (train/uptrain.py) on a converted tiny Llama built here, one process.

    python -m pytest tests/train/test_convert_uptrain.py -q

- Attention transfer moves EVA's maps and nothing else (every other weight of OUT/hf is the
  converted source's, bit for bit) and lowers the layers' error against the original attention on
  lines it never trained on; the error is measured by an oracle written here (the softmax Llama's
  own attention outputs), not by the training loss.
- LoRA uptraining changes the adapted projections and EVA's maps only, and OUT/hf (adapters
  merged) loads with `AutoModelForCausalLM(..., trust_remote_code=True)` and runs `generate()`.
- The trainable tensors of a run's newest checkpoint (a small file) rebuild its OUT/hf bit for bit from
  the converted folder alone; a file that is not the run's is refused.
- A run file that cannot work is one line, exit 2.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from evalm.train.uptrain import main  # noqa: E402
from tests.train.helpers import write_shards  # noqa: E402
from tests.train.llama_helpers import converted_tiny, tiny_llama_folder, uptrain_file  # noqa: E402


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(the tiny Llama, its EVA conversion, shards): tests.train.llama_helpers.converted_tiny."""
    return converted_tiny(tmp_path_factory.mktemp("uptrain"))


def weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def attention_error(folder, x: torch.Tensor) -> float:
    """Σ over layers of the mean squared difference between EVA's attention output and causal softmax
    (written out here) over the same rotated heads, each layer fed the softmax model's hidden states."""
    from evalm import register_with_transformers
    from evalm.hf_attention import eva_of

    register_with_transformers()
    eva = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    softmax = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    heads: list[tuple] = []
    plain = transformers.AttentionInterface._global_mapping["sdpa"]

    def record(module, query, key, value, *args, **kwargs):  # the softmax model's heads (B, H, T, D), rotated
        heads.append((module.layer_idx, query, key, value))
        return plain(module, query, key, value, *args, **kwargs)

    transformers.AttentionInterface.register("recorded", record)
    softmax.config._attn_implementation = "recorded"
    total = 0.0
    with torch.no_grad():
        softmax(x, use_cache=False)
        for i, query, key, value in heads:
            groups = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
            T, D = query.shape[-2:]
            logits = query @ key.transpose(-1, -2) * D**-0.5 + torch.full((T, T), float("-inf")).triu(1)
            want = (torch.softmax(logits, -1) @ value).transpose(1, 2)
            q, k, v = (t.transpose(1, 2).contiguous() for t in (query, key, value))
            total += float(((eva_of(eva.model.layers[i].self_attn).attend(q, k, v) - want) ** 2).mean())
    return total


def test_attention_transfer_moves_only_evas_maps_and_lowers_their_error(converted, tmp_path):
    _, eva, shards = converted
    run = uptrain_file(tmp_path / "run.toml", eva, shards, steps=16, lr=0.1)
    assert main(["--config", str(run), "--out", str(tmp_path / "out")]) == 0
    before, after = weights(eva), weights(tmp_path / "out" / "hf")
    assert before.keys() == after.keys()
    moved = {name for name in before if not torch.equal(before[name], after[name])}
    assert moved and all(".eva." in name for name in moved), sorted(moved)
    held_out = torch.randint(0, 63, (2, 32), generator=torch.Generator().manual_seed(123))
    assert attention_error(tmp_path / "out" / "hf", held_out) < 0.9 * attention_error(eva, held_out)
    record = json.loads((tmp_path / "out" / "hf" / "convert.json").read_text())
    assert record["uptrained"]["config"]["uptrain"]["objective"] == "attention-transfer"


def test_the_transfer_loss_is_the_layers_error_against_the_softmax_written_here(converted, tmp_path):
    """The logged loss of a transfer step is Σ over layers of EVA's mean squared error against causal softmax of the
    same heads (written out in `attention_error`, each layer fed the softmax model's hidden states: the targets),
    averaged over the step's micro-batches; the lines are the first four the trainer reads ([data] seed 1234, shuffled)."""
    from evalm.train.attention_probe import read_lines

    _, eva, shards = converted
    run = uptrain_file(tmp_path / "run.toml", eva, shards, steps=1, save_every=1)  # the loss is taken before the update
    assert main(["--config", str(run), "--out", str(tmp_path / "out")]) == 0
    logged = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    lines = read_lines(shards, 32, 4, seed=1234)  # [data] seed's default
    want = sum(attention_error(eva, torch.stack(lines[a : a + 2])) for a in (0, 2)) / 2
    assert logged == pytest.approx(want, rel=1e-4)


def test_lora_uptraining_changes_the_adapted_projections_and_the_export_generates(converted, tmp_path):
    _, eva, shards = converted
    run = uptrain_file(tmp_path / "run.toml", eva, shards, parameters="lora", objective="lm", steps=3)
    assert main(["--config", str(run), "--out", str(tmp_path / "out")]) == 0
    losses = [json.loads(line)["loss"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and all(0 < x < 10 for x in losses)
    before, after = weights(eva), weights(tmp_path / "out" / "hf")
    moved = {name.split(".")[-2] for name in before if not torch.equal(before[name], after[name])}
    assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= moved <= {"q_proj", "k_proj", "v_proj", "o_proj", "0"}
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "hf", trust_remote_code=True)
    out = model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 16)


def test_the_window_only_control_trains_without_reading_the_summaries(converted, tmp_path, capsys):
    """`[uptrain] eva_ablation = "no-remote"`: LoRA on the window alone. EVA's maps get no gradient (nothing reads
    the summaries), so they are the converted folder's bit for bit, where the same run with summaries moves them."""
    _, eva, shards = converted
    moved = {}
    for ablation in ("none", "no-remote"):
        run = uptrain_file(tmp_path / f"{ablation}.toml", eva, shards, parameters="lora", objective="lm", steps=2,
                           extra=f'eva_ablation = "{ablation}"')
        assert main(["--config", str(run), "--out", str(tmp_path / ablation)]) == 0
        before, after = weights(eva), weights(tmp_path / ablation / "hf")
        moved[ablation] = {name for name in before if not torch.equal(before[name], after[name])}
    assert any(".eva." in name for name in moved["none"])
    assert moved["no-remote"] and not any(".eva." in name for name in moved["no-remote"])
    run = uptrain_file(tmp_path / "bad.toml", eva, shards, extra='eva_ablation = "no-remote"')
    with pytest.raises(SystemExit) as stop:
        main(["--config", str(run), "--out", str(tmp_path / "bad")])
    assert stop.value.code == 2 and "which the ablation never reads" in capsys.readouterr().err


def test_a_run_rebuilt_from_its_trainable_tensors_is_its_export_bit_for_bit(converted, tmp_path):
    """The GPU study's way home (benchmarks/convert.py `trainables` / `rebuild`): the trainable tensors of
    the newest checkpoint, a small file, rebuild OUT/hf from the converted folder alone."""
    from safetensors.torch import load_file, save_file

    from evalm.train.uptrain import load_config
    from evalm.train.uptrain_model import export_run, save_trainables

    _, eva, shards = converted
    run = uptrain_file(tmp_path / "run.toml", eva, shards, parameters="lora", objective="lm", steps=3)
    assert main(["--config", str(run), "--out", str(tmp_path / "out")]) == 0
    config = load_config(run, [])
    small = save_trainables(tmp_path / "out", config, tmp_path / "trainables.safetensors")
    names = set(load_file(small))
    assert names and all("lora_" in n or ".eva." in n for n in names), sorted(names)
    assert small.stat().st_size < (eva / "model.safetensors").stat().st_size / 2
    rebuilt = export_run(tmp_path / "elsewhere", config, trainables=small)  # no checkpoint there
    want, got = weights(tmp_path / "out" / "hf"), weights(rebuilt)
    assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)
    assert any(not torch.equal(want[n], weights(eva)[n]) for n in want)  # it trained: the file carried something
    record = json.loads((rebuilt / "convert.json").read_text())
    assert record["uptrained"]["trainables"] == str(small)
    from safetensors import safe_open

    tensors = load_file(small)
    tensors.pop(sorted(tensors)[0])
    with safe_open(str(small), framework="pt") as f:  # the run's own record, one tensor fewer
        save_file(tensors, str(tmp_path / "short.safetensors"), metadata=f.metadata())
    with pytest.raises(ValueError, match="1 missing"):
        export_run(tmp_path / "other", config, trainables=tmp_path / "short.safetensors")


def test_what_uptrain_cannot_run_is_one_line(converted, tmp_path, capsys):
    source, eva, shards = converted
    cases = [(dict(parameters="lora"), "trains EVA's parameters alone"),
             (dict(extra="[checkpoint]\ninit_from = \"x\"\n"), None),
             (dict(), "model_type 'llama'")]
    for i, (kwargs, said) in enumerate(cases):
        folder = source if said == "model_type 'llama'" else eva
        if kwargs.get("extra"):
            run = uptrain_file(tmp_path / f"{i}.toml", folder, shards)
            run.write_text(run.read_text().replace("keep_latest_k = 0", "keep_latest_k = 0\ninit_from = \"x\""))
            said = "init_from is not used"
        else:
            run = uptrain_file(tmp_path / f"{i}.toml", folder, shards, **kwargs)
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main(["--config", str(run), "--out", str(tmp_path / f"out{i}")])
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and said in err and len(err.splitlines()) == 1, err


def documented_lines() -> list[str]:
    """The `evalm convert` and `evalm train uptrain` lines of docs/training.md (run by the test below;
    tests/test_doc_lines.py's OWNERS names this function)."""
    from tests.doc_lines import ROOT, command_lines

    return [line for _, line in command_lines([ROOT / "docs" / "training.md"])
            if line.startswith(("evalm convert", "evalm train uptrain"))]


def test_the_documented_lines_run_on_the_tiny_llama(tmp_path, monkeypatch):
    """docs/training.md's three lines as written, on the tiny Llama, with `--set` sizes appended: w = 8,
    c = 4; 32-token lines, 2 steps (the later `--set` wins)."""
    import shlex

    from evalm.launcher.cli import main as evalm

    tiny_llama_folder(tmp_path / "models" / "llama", dtype="float32")
    write_shards(tmp_path / "runs" / "llama-tokens")
    small = {"evalm convert": ["--set", "eva.window_size=8", "--set", "eva.chunk_size=4"],
             "evalm train uptrain": ["--set", "data.seq_len=32", "--set", "train.steps=2", "--set", "train.device=\"cpu\"",
                                     "--set", "checkpoint.save_every=2"]}
    lines = documented_lines()
    assert [line.split(" --")[0] for line in lines] == ["evalm convert", *["evalm train uptrain"] * 2]
    monkeypatch.chdir(tmp_path)  # the lines' relative paths; configs/NAME.toml resolves to the shipped file
    for line in lines:
        argv = shlex.split(line)
        assert evalm([*argv[1:], *small[line.split(" --")[0]]]) == 0, line
    assert (tmp_path / "runs" / "llama-lora" / "hf" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "runs" / "llama-lora" / "hf" / "convert.json").read_text())["convert"]["source"]


def test_activation_checkpointing_recomputes_each_layer_and_changes_no_number(converted, tmp_path):
    """`train.activation_checkpointing=true` on an uptraining run: every decoder layer runs again in backward
    (counted by forward pre-hooks on its MLPs, inside what is recomputed: a recomputation stops once it has
    what backward needs, before an MLP returns), and the gradients are those without it, with the summaries'
    training noise off (the default) and on (the recomputation replays the same ε); a LoRA run's logged
    losses are the same steps' losses."""
    from evalm.train.uptrain_model import CausalLMLogits, enable_checkpointing, load_converted

    _, eva, shards = converted
    ids = torch.arange(3, 35).reshape(1, 32)
    for noise in (False, True):
        grads, calls = [], []
        for checkpointed in (False, True):
            hf = load_converted(eva)
            if checkpointed:
                enable_checkpointing(hf)
            model = CausalLMLogits(hf, summary_noise=noise).train()
            count = [0]
            for layer in hf.model.layers:
                layer.mlp.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
            torch.manual_seed(7)
            logits = model(ids[:, :-1])
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[0, 1:]).backward()
            calls.append(count[0])
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        n = len(hf.model.layers)
        assert calls == [n, 2 * n]
        torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-6)
    losses = []
    for name, extra in (("plain", ""), ("ac", "activation_checkpointing = true\n")):
        run = uptrain_file(tmp_path / f"{name}.toml", eva, shards, parameters="lora", objective="lm", steps=2)
        run.write_text(run.read_text().replace('device = "cpu"\n', f'device = "cpu"\n{extra}'))
        assert main(["--config", str(run), "--out", str(tmp_path / name)]) == 0
        rows = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        losses.append([json.loads(line)["loss"] for line in rows])
    assert len(losses[0]) == 2 and losses[1] == pytest.approx(losses[0], rel=1e-6, abs=0)
