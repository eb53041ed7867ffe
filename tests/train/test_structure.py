"""Tuning under the SAICL mask (train.structure): the logits the trainer trains on are exactly the
evaluator's `saicl` computation (each demonstration its own cache from position 0, the test after
their merge at the group length), oracle built from evalm.cache directly."""

from __future__ import annotations

import pytest
import torch

from evalm.cache import merge
from evalm.config import ModelConfig
from evalm.model import EvalmModel
from evalm.train.config import MsitDataConfig
from evalm.train.data import IGNORE
from evalm.train.structure import Packed, SaiclMask
from tests.models import visible_model

EOS = 30


def _model() -> EvalmModel:
    cfg = ModelConfig(vocab_size=32, d_model=16, n_layer=2, n_head=2, d_ff=32, window_size=4, chunk_size=2,
                      circular_period=64, attention="eva", dropout=0.0, attn_dropout=0.0)
    return visible_model(cfg).double().eval()


def _lines(n_lines: int, n_examples: int, width: int, seq_len: int, seed: int = 1):
    """Packed lines of examples [x_1 .. x_{w-2}, label, eos] (answer and eos are targets), eos-padded,
    as train.data.LineLoader hands them to the trainer."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((n_lines, seq_len + 1), EOS)
    mask = torch.zeros((n_lines, seq_len + 1), dtype=torch.bool)
    for b in range(n_lines):
        for m in range(n_examples):
            ex = torch.cat([torch.randint(0, 20, (width - 2,), generator=g), torch.randint(20, 24, (1,), generator=g),
                            torch.tensor([EOS])])
            ids[b, m * width:(m + 1) * width] = ex
            mask[b, (m + 1) * width - 2:(m + 1) * width] = True
    targets = torch.where(mask[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], IGNORE))
    return ids[:, :-1], targets


def test_saicl_logits_equal_the_evaluators_merged_caches():
    model, width, n, q = _model(), 6, 7, 3  # 6-token groups: window entries and completed chunks both count
    inputs, targets = _lines(2, n, width, seq_len=50)
    structure = SaiclMask(EOS, queries=q)
    (demos, tests), test_targets = structure.prepare(inputs, targets)
    assert demos.shape == (2 * (n - q), width) and tests.shape == (2 * q, width)
    with torch.no_grad():
        logits = structure.logits(model, (demos, tests), "cpu")
    for b in range(2):
        units = inputs[b, : n * width].reshape(n, width)
        segments = [torch.cat([torch.tensor([EOS]), u[:-1]]) for u in units]  # [eos] I(x, y), as the evaluator
        caches = []
        with torch.no_grad():
            for seg in segments[: n - q]:
                c = model.new_cache()
                model(seg[None], cache=c)
                caches.append(c)
            for j in range(q):
                merged = merge(caches, 0.0, position_offset=width)
                expected = model(segments[n - q + j][None], cache=merged)[0]
                torch.testing.assert_close(logits[b * q + j], expected, rtol=0, atol=1e-10)
                unit = units[n - q + j]
                assert test_targets[b * q + j].tolist() == [IGNORE] * (width - 2) + unit[-2:].tolist()
        packed = Packed().logits(model, inputs[b:b + 1], "cpu")[0]  # the same tokens with the packed mask
        last = (n - 1) * width - 1  # the last test segment's first position in the line
        assert not torch.allclose(packed[last: last + width], logits[b * q + q - 1])


def test_gradient_reaches_the_demonstrations():
    model, width = _model(), 6
    inputs, targets = _lines(1, 6, width, seq_len=40)
    structure = SaiclMask(EOS, queries=2)
    (demos, tests), test_targets = structure.prepare(inputs, targets)
    embedded = []

    def keep(module, args, out):
        out.retain_grad()
        embedded.append(out)

    handle = model.embed_tokens.register_forward_hook(keep)
    loss = torch.nn.functional.cross_entropy(structure.logits(model, (demos, tests), "cpu").flatten(0, 1),
                                             test_targets.flatten(), ignore_index=IGNORE)
    loss.backward()
    handle.remove()
    demo_grad = embedded[0].grad  # the demonstrations' embeddings: the test loss depends on them
    assert demo_grad.shape[0] == demos.shape[0] and demo_grad.abs().sum(dim=(1, 2)).min() > 0


def test_unequal_examples_and_pretraining_lines_are_refused():
    inputs, targets = _lines(1, 5, 6, seq_len=40)
    inputs[0, 12:18] = torch.tensor([1, 2, 3, EOS, 4, 5])  # the third example ends early
    with pytest.raises(ValueError, match="one token length"):
        SaiclMask(EOS, queries=2).prepare(inputs, targets)
    with pytest.raises(ValueError, match="pretrain_fraction = 0"):
        MsitDataConfig(structure="saicl", pretrain_fraction=0.25, pretrain_shards="x")


@pytest.mark.slow  # ~7 s on 2 cores; the FSDP gradients under the same mask stay in CI
def test_msit_under_the_saicl_mask_trains_on_two_gloo_ranks(tmp_path):
    """`evalm train msit` with data.structure = "saicl", FSDP2 over 2 processes: the caches carry
    gradients through the sharded blocks (a dataclass cache would be copied by FSDP, train.structure)."""
    import json
    import random
    import subprocess
    import sys

    from tests.train.helpers import free_port

    rng = random.Random(0)
    rows = []
    for episode in range(12):  # a fresh rule per task: 6 one-letter inputs -> 3 one-letter labels
        rule = {x: rng.choice("ABC") for x in "abcdef"}
        rows += [{"task": f"synthetic-{episode:03d}", "input": x, "output": rule[x]}
                 for x in (rng.choice("abcdef") for _ in range(40))]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run.toml"
    run.write_text(f"""
[model]
vocab_size = 258
d_model = 32
n_layer = 2
n_head = 2
d_ff = 64
window_size = 8
chunk_size = 4
circular_period = 64
dropout = 0.0
attn_dropout = 0.0

[data]
train_file = "{tmp_path / 'train.jsonl'}"
tokenizer = "bytes"
seq_len = 128
default_template = ["{{input}}", "{{output}}"]
structure = "saicl"
saicl_queries = 4

[optim]
lr = 3e-3
warmup_steps = 1

[train]
steps = 3
batch_size = 2
device = "cpu"
log_every = 1

[checkpoint]
save_every = 3
""")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--master_port={free_port()}",
                           "--nproc_per_node=2", "-m", "evalm.train.msit", "--config", str(run), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 3 and all(0 < x < 10 for x in losses)


def test_fsdp_gradients_under_the_saicl_mask_equal_an_unsharded_model():
    """Two gloo ranks, each half the lines: FSDP2's reduced gradients equal a single unsharded model's
    on all lines. With the blocks sharded on their own (the packed default), this fails: the test
    pass reads the demonstrations' keys inside each block, past its hooks."""
    import os
    import subprocess
    import sys

    from tests.train.helpers import free_port

    def run(mode: str):
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--master_port={free_port()}",
                               "--nproc_per_node=2", "-m", "tests.train.saicl_fsdp_worker", mode],
                              capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})

    proc = run("root")
    assert proc.returncode == 0, proc.stderr[-3000:]
    worst = float(proc.stdout.split("max gradient difference")[1].split()[0])
    # In ulps of each parameter's largest gradient: the two sides sum the same 56 per-token gradients
    # in another grouping (two half-batches, then the all-reduce), float32 on both. Reassociating a
    # sum moves it by a few ulps of its scale on any CPU (AMD EPYC, AVX-512: 2.3 at most); a gradient
    # that misses a term is off by a sizeable part of its scale, millions of ulps.
    assert worst < 64
    assert run("blocks").returncode != 0
