"""MSIT packing invariants (docs/training.md): whole examples, exact line lengths, answer-only masks.

    python -m pytest tests/train/test_packing.py -q

Each packed line is decoded back into examples by walking the known encodings, so every invariant
is checked against the examples themselves, not against the packer's own bookkeeping.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evalm.text.tokenizer import ByteTokenizer
from evalm.train.config import MsitDataConfig
from evalm.train.data import IGNORE, LineLoader
from evalm.train.packing import Example, build_lines, encode_example, held_out, iter_examples

TEMPLATES = {"add": ["Q: {input}\nA:", " {output}"], "echo": ["Say {input}:", " {output}"]}
SAMPLE = str(Path(__file__).resolve().parents[2] / "train" / "samples" / "msit-sample.jsonl")


def examples(n: int = 40) -> list[Example]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        a, b = rng.integers(0, 1000, 2)
        out.append(Example("add", f"{a}+{b}", str(a + b)))
        out.append(Example("echo", "x" * int(rng.integers(1, 30)), "y" * int(rng.integers(1, 9))))
        out.append(Example("long", "z" * 300, "w"))  # longer than a 64-token line
    return out


def config(**kw) -> MsitDataConfig:
    return MsitDataConfig(**{"templates": TEMPLATES, "seq_len": 64, **kw})


def split_line(ids: np.ndarray, mask: np.ndarray, encodings: dict[tuple, tuple]):
    """Walk a line: every example must start at the cursor; the rest must be masked eos padding."""
    at, found = 0, []
    while at < len(ids):
        match = [(key, e) for key, e in encodings.items() if np.array_equal(ids[at: at + len(e[0])], e[0])]
        if not match:
            break
        key, (e_ids, e_mask) = max(match, key=lambda m: len(m[1][0]))
        assert np.array_equal(mask[at: at + len(e_ids)], e_mask), f"mask differs inside {key}"
        found.append(key)
        at += len(e_ids)
    return found, at


def test_lines_hold_whole_examples_with_exact_answer_masks():
    tok, cfg = ByteTokenizer(), config()
    exs = examples()
    lines, stats = build_lines(cfg, tok, exs)
    encodings = {}
    for e in exs:
        enc = encode_example(e, tok, cfg)
        encodings[(e.task, e.input, e.output)] = (enc.ids, enc.mask)
    assert lines.ids.shape[1] == cfg.seq_len + 1 and lines.masks.shape == lines.ids.shape  # exact lengths
    seen = []
    for ids, mask in zip(lines.ids, lines.masks):
        found, end = split_line(ids, mask, encodings)
        assert found, "a line without a whole example"
        assert (ids[end:] == tok.eos_id).all() and (mask[end:] == 0).all()  # only padding after
        assert len({key[0] for key in found}) == 1  # group_by_task: one task per line
        seen += found
    kept = [(e.task, e.input, e.output) for e in exs if e.task != "long"]
    assert sorted(seen) == sorted(kept)  # every fitting example exactly once, none split
    assert stats["dropped_oversize"] == 40 and stats["examples"] == len(kept)


def test_answer_mask_covers_answer_and_eos_only():
    tok, cfg = ByteTokenizer(), config()
    enc = encode_example(Example("add", "2+3", "5"), tok, cfg)
    text = "Q: 2+3\nA:"
    assert enc.ids.tolist() == [*text.encode(), *b" 5", tok.eos_id]
    assert enc.mask.tolist() == [0] * len(text) + [1, 1, 1]
    everything = encode_example(Example("add", "2+3", "5"), tok, config(loss_on="all"))
    assert everything.mask.all()


def test_loader_targets_are_ignored_outside_answers():
    tok, cfg = ByteTokenizer(), config()
    lines, _ = build_lines(cfg, tok, examples())
    loader = LineLoader(lines, rank=0, world_size=1, batch_size=len(lines), shuffle=False, seed=0)
    inputs, targets = loader.next_batch()
    assert inputs.shape == targets.shape == (len(lines), cfg.seq_len)
    expected = np.where(lines.masks[:, 1:] == 1, lines.ids[:, 1:], IGNORE)
    assert np.array_equal(targets.numpy(), expected)
    assert np.array_equal(inputs.numpy(), lines.ids[:, :-1])


def test_split_mode_streams_examples_across_lines():
    tok, cfg = ByteTokenizer(), config(allow_split=True, group_by_task=False)
    exs = [e for e in examples() if e.task != "long"]
    lines, _ = build_lines(cfg, tok, exs)
    stream = lines.ids.reshape(-1)
    order = np.random.default_rng(cfg.seed).permutation(len(exs))
    whole = np.concatenate([encode_example(exs[i], tok, cfg).ids for i in order])
    assert np.array_equal(stream[: len(whole)], whole)  # nothing lost, nothing reordered
    assert (stream[len(whole):] == tok.eos_id).all() and len(stream) - len(whole) <= cfg.seq_len


def test_truncate_keeps_oversize_examples_cut_to_a_line():
    lines, stats = build_lines(config(oversize="truncate"), ByteTokenizer(), examples(5))
    assert stats["truncated"] == 5 and stats["dropped_oversize"] == 0
    assert lines.ids.shape[1] == 65


def test_held_out_clusters_never_reach_the_lines():
    cfg = config(clusters={"math": ["add"], "copy": ["echo"]}, held_out_clusters=["math"], held_out_tasks=["long"])
    assert held_out(cfg) == {"add", "long"}
    lines, stats = build_lines(cfg, ByteTokenizer(), examples())
    assert stats["tasks"] == ["echo"] and stats["removed_held_out"] == 80
    assert b"Q: " not in bytes(int(i) for i in lines.ids.reshape(-1) if i < 256)


def test_unknown_held_out_cluster_is_refused():
    with pytest.raises(ValueError, match="held_out_clusters"):
        config(clusters={"math": ["add"]}, held_out_clusters=["nlg"])


def test_shipped_sample_reads_and_packs():
    exs = list(iter_examples(SAMPLE))
    assert len(exs) == 900 and {e.task for e in exs} == {"add", "subtract", "reverse", "upper", "sentiment", "topic"}
    lines, stats = build_lines(MsitDataConfig(train_file=SAMPLE, seq_len=512), ByteTokenizer())
    assert stats["examples"] == 900 and lines.ids.shape[1] == 513


def test_bad_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task": "a", "input": "b", "output": "c"}\n{"task": "a"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: row 2 has no 'input', 'output'"):
        list(iter_examples(path))


class _Lines:
    def __init__(self, tag: int, n: int, seq_len: int = 4):
        self.tag, self.n, self.seq_len = tag, n, seq_len

    def __len__(self) -> int:
        return self.n

    def line(self, i: int):
        return np.full(self.seq_len + 1, self.tag * 1000 + i), (None if self.tag == 2 else np.ones(self.seq_len + 1))


def test_mixed_lines_keep_every_tuning_line_and_spread_pretraining_lines_at_the_rate():
    from evalm.train.packing import MixedLines

    mixed = MixedLines(_Lines(1, 90), _Lines(2, 7), fraction=0.25)
    lines = [mixed.line(i) for i in range(len(mixed))]
    tuning = sorted(int(ids[0]) - 1000 for ids, mask in lines if mask is not None)
    pretraining = [int(ids[0]) - 2000 for ids, mask in lines if mask is None]
    assert tuning == list(range(90))  # every tuning line exactly once per pass
    assert len(pretraining) == len(mixed) - 90 and abs(len(pretraining) / len(mixed) - 0.25) < 0.02
    assert pretraining[:8] == [0, 1, 2, 3, 4, 5, 6, 0]  # cycling through the pretraining lines
    gaps = np.diff([i for i, (_, mask) in enumerate(lines) if mask is None])
    assert gaps.min() >= 3 and gaps.max() <= 5  # evenly spread, not bunched
    with pytest.raises(ValueError, match="pretrain_fraction"):
        MixedLines(_Lines(1, 9), _Lines(2, 7), fraction=1.0)
