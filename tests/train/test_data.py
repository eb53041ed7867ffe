"""Tokenizer, token shards and the line loader.

    python -m pytest tests/train/test_data.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from evalm.text.tokenizer import load_tokenizer
from tests.train.helpers import write_shards
from evalm.train.data import LineLoader
from evalm.train.shards import PretrainLines, ShardWriter, TokenShards, token_dtype
from evalm.train.tokenizer import main as tokenizer_main
from evalm.train.tokenizer import read_documents

SAMPLE = Path(__file__).resolve().parents[2] / "train" / "samples" / "documents.jsonl"


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    assert tokenizer_main(["--input", str(SAMPLE), "--output", str(out), "--vocab-size", "512",
                           "--tokens-per-shard", "20000"]) == 0
    return out


def test_bpe_round_trips_every_shipped_document(encoded):
    tok = load_tokenizer(encoded / "tokenizer.json")
    assert tok.vocab_size == 512 and tok.eos_id == 0
    docs = list(read_documents([SAMPLE]))
    assert len(docs) == 344 and any(not t.isascii() for t, _ in docs)
    for text, _ in docs:
        assert tok.decode(tok.encode(text)) == text


def test_shards_hold_each_document_then_eos_with_subset_tags(encoded):
    tok = load_tokenizer(encoded / "tokenizer.json")
    shards = TokenShards(encoded)
    manifest = json.loads((encoded / "manifest.json").read_text())
    assert manifest["dtype"] == "uint16" and len(manifest["shards"]) > 1
    docs = list(read_documents([SAMPLE]))
    index = np.concatenate([shards.documents(i) + [shards.starts[i], 0, 0] for i in range(len(manifest["shards"]))])
    assert len(index) == len(docs) == manifest["documents"]
    for (start, length, tag), (text, subset) in zip(index, docs):
        ids = shards.read(int(start), int(length))
        assert ids[-1] == tok.eos_id and tok.decode(ids[:-1].tolist()) == text
        assert manifest["subsets"][tag] == subset
    assert len(shards) == manifest["tokens"] == int(index[-1, 0] + index[-1, 1])


def test_dtype_widens_past_uint16(tmp_path):
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    writer = ShardWriter(tmp_path, vocab_size=70000, eos_id=69999, tokenizer="x")
    writer.add([65536, 1, 69998], "s")
    writer.close()
    assert TokenShards(tmp_path).read(0, 4).tolist() == [65536, 1, 69998, 69999]


def test_folder_without_manifest_is_incomplete(tmp_path):
    ShardWriter(tmp_path, vocab_size=10, eos_id=9, tokenizer="x").add([1, 2], "s")  # never closed
    with pytest.raises(FileNotFoundError, match="no manifest"):
        TokenShards(tmp_path)


def test_lines_are_exact_windows_across_shard_boundaries(tmp_path):
    write_shards(tmp_path, tokens_per_shard=300)
    shards = TokenShards(tmp_path)
    stream = np.concatenate([np.asarray(a, dtype=np.int64) for a in shards.arrays])
    lines = PretrainLines(shards, 32)
    assert len(lines) == (len(stream) - 1) // 32
    for i in range(len(lines)):
        tokens, mask = lines.line(i)
        assert mask is None and np.array_equal(tokens, stream[i * 32: i * 32 + 33])


def test_ranks_partition_each_epoch_and_resume_exactly(tmp_path):
    """Two ranks see disjoint lines covering an epoch; a restored loader yields the same next batches
    (torchtitan `test_c4_resumption`)."""
    write_shards(tmp_path)
    lines = PretrainLines(TokenShards(tmp_path), 16)
    loaders = [LineLoader(lines, rank=r, world_size=2, batch_size=1, shuffle=True, seed=3) for r in (0, 1)]
    firsts = [[tuple(ld.next_batch()[0][0].tolist()) for _ in range(len(lines) // 2)] for ld in loaders]
    all_lines = {tuple(lines.line(i)[0][:-1].tolist()) for i in range(len(lines))}
    assert set(firsts[0]).isdisjoint(firsts[1]) and set(firsts[0]) | set(firsts[1]) <= all_lines
    snapshot = loaders[0].state_dict()
    expected = [loaders[0].next_batch() for _ in range(len(lines))]  # runs into the next epoch
    restored = LineLoader(lines, rank=0, world_size=2, batch_size=1, shuffle=True, seed=3)
    restored.load_state_dict(snapshot)
    for want in expected:
        got = restored.next_batch()
        assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(want, got))
    single = LineLoader(lines, rank=0, world_size=1, batch_size=1, shuffle=True, seed=3)
    single.load_state_dict(snapshot)  # fewer ranks: continue after every line both ranks consumed
    assert single.position == 2 * snapshot["cursor"]


def test_pipeline_output_folder_skips_dropped_documents(tmp_path):
    """A data-pipeline output: documents/*.jsonl.zst are read, rejected/ and removed/ are not."""
    import zstandard

    from evalm.train.tokenizer import document_files

    def write(path: Path, rows: list[dict]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(zstandard.ZstdCompressor().compress("".join(json.dumps(r) + "\n" for r in rows).encode()))

    write(tmp_path / "documents" / "00000.jsonl.zst", [{"text": "kept", "metadata": {"pile_set_name": "Pile-CC"}},
                                                      {"text": "raw", "meta": {"pile_set_name": "Books3"}}])
    write(tmp_path / "rejected" / "00000.jsonl.zst", [{"text": "dropped", "filter_reason": "x"}])
    write(tmp_path / "removed" / "00000.jsonl.zst", [{"text": "duplicate"}])
    files = document_files(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in files] == ["documents/00000.jsonl.zst"]
    assert list(read_documents(files)) == [("kept", "Pile-CC"), ("raw", "Books3")]


def _consume(loaders: list[LineLoader], steps: int, per_step: int) -> list[int]:
    """Line ids all ranks read in `steps` lockstep steps of `per_step` batches each."""
    seen = []
    for _ in range(steps * per_step):
        for ld in loaders:
            batch = ld.next_batch()[0]
            seen += [ld.source.index_of[tuple(row.tolist())] for row in batch]
    return seen


@pytest.mark.parametrize(("old", "new"), [((2, 2), (1, 2)), ((1, 2), (2, 2)), ((2, 2), (1, 3)), ((1, 3), (2, 1))])
def test_any_world_size_and_batch_continues_the_exact_prefix(tmp_path, old, new):
    """(world, batch) before and after a checkpoint: the lines read are the uninterrupted prefix,
    none twice (1 -> 2 ranks once skipped lines 21-39)."""
    write_shards(tmp_path)
    lines = PretrainLines(TokenShards(tmp_path), 16)
    lines.index_of = {tuple(lines.line(i)[0][:-1].tolist()): i for i in range(len(lines))}
    make = lambda world, batch: [LineLoader(lines, rank=r, world_size=world, batch_size=batch, shuffle=True,
                                            seed=3) for r in range(world)]
    before = make(*old)
    seen = _consume(before, steps=3, per_step=1)
    after = make(*new)
    for ld in after:
        ld.load_state_dict(before[0].state_dict())
    seen += _consume(after, steps=2, per_step=1)
    order = np.random.default_rng([3, 0]).permutation(len(lines))  # epoch 0's order, by definition
    assert len(seen) == len(set(seen)) and sorted(seen) == sorted(order[: len(seen)].tolist())
