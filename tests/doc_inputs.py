"""Stand-in inputs for the documented command lines: what a line reads that only the user has, written
at the path the docs name (placeholders such as DIR included), CI-sized. tests/test_doc_lines.py names
each in its INPUTS table with the reason."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.doc_lines import ROOT


def link_checkout(work: Path) -> None:
    for rel in ("configs", "train/samples", "data_pipeline/budgets", "benchmarks"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).symlink_to(ROOT / rel)


def jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def labelled_rows(n: int, field: str, n_labels: int) -> list[dict]:
    from tests.models import WORDS

    return [{field: f"{WORDS[i % len(WORDS)]} {WORDS[(3 * i) % len(WORDS)]} {i}", "label": i % n_labels}
            for i in range(n)]


def hf_lm(rel: str, kind: str = "gpt2"):
    def build(work: Path) -> None:
        from tests.models import hf_causal_lm

        hf_causal_lm(work / rel, kind)
    return build


def t5(work: Path) -> None:
    from tests.models import hf_t5

    hf_t5(work / "T5DIR")


def exported(rel: str):
    def build(work: Path) -> None:
        from tests.models import byte_model

        byte_model(work / rel)
    return build


def task(rel: str, n_train: int = 80):
    def build(work: Path) -> None:
        from tests.models import two_label_task

        two_label_task(work / rel, n_train=n_train, n_test=4)
    return build


def agnews(work: Path) -> None:
    for split, n in (("train", 40), ("test", 4)):
        jsonl(work / "data" / "agnews" / f"{split}.jsonl", labelled_rows(n, "text", 4))


def sst2_folder(work: Path) -> None:
    for split, n in (("train", 80), ("test", 4)):
        jsonl(work / "DATA" / f"{split}.jsonl", labelled_rows(n, "sentence", 2))


def sst2_cache(work: Path) -> None:
    from tests.hub_cache import write_hub_cache

    splits = {hub: {k: [r[k] for r in rows] for k in ("sentence", "label")} | {"idx": list(range(len(rows)))}
              for hub, rows in (("train", labelled_rows(520, "sentence", 2)), ("validation", labelled_rows(8, "sentence", 2)))}
    write_hub_cache(work / "hub", "nyu-mll/glue", "sst2", splits)


def banking77_cache(work: Path) -> None:
    import datasets

    from tests.hub_cache import write_hub_cache

    names = ["card_arrival", "pin_blocked", "top_up_failed"]
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)})
    splits = {split: {k: [r[k] for r in rows] for k in ("text", "label")}
              for split, rows in (("train", labelled_rows(120, "text", 3)), ("test", labelled_rows(4, "text", 3)))}
    write_hub_cache(work / "hub", "PolyAI/banking77", None, splits, features=features)


def seeded_books() -> list[tuple[str, str]]:
    """Two (title, text) books of seeded sentences."""
    from tests.launcher.samples_fixture import document

    rng = random.Random(0)
    return [(f"book{k}", "\n".join(document(rng, 12) for _ in range(6))) for k in range(2)]


def pg19_cache(work: Path) -> None:
    from tests.hub_cache import write_hub_cache

    books = seeded_books()
    write_hub_cache(work / "hub", "deepmind/pg19", None, {"test": {
        "short_book_title": [b for b, _ in books], "publication_date": [1900] * len(books),
        "url": [f"local://{b}" for b, _ in books], "text": [t for _, t in books]}})


def pg19_folder(work: Path) -> None:
    for b, text in seeded_books():
        (work / "pg19" / "test").mkdir(parents=True, exist_ok=True)
        (work / "pg19" / "test" / f"{b}.txt").write_text(text)


def pile(work: Path) -> None:
    import zstandard

    from tests.launcher.samples_fixture import write_samples

    samples = write_samples(work / "stand-in")
    shards = sorted((samples / "pile").glob("*.jsonl"))
    (work / "data" / "pile" / "train").mkdir(parents=True)
    for k, shard in enumerate(shards):
        (work / "data" / "pile" / "train" / f"{k:02d}.jsonl.zst").write_bytes(
            zstandard.ZstdCompressor().compress(shard.read_bytes()))
    (samples / "pile").rename(work / "data" / "corpus")


def data_toml(work: Path) -> None:
    """The guide's own defaults block, as the file `--config data.toml` names."""
    text = (ROOT / "docs" / "data_pipeline.md").read_text()
    block = text.split("## Configuration (`--config data.toml`)", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    (work / "data.toml").write_text(block)


def samples(work: Path) -> None:
    from tests.launcher.samples_fixture import write_samples

    write_samples(work / "data" / "samples")
    task("data/samples/tasks/rotten_tomatoes")(work)


def harness_task(work: Path) -> None:
    for split, n in (("train", 20), ("test", 4)):
        jsonl(work / "tasks" / f"{split}.jsonl", labelled_rows(n, "text", 2))
    (work / "tasks" / "my_task.yaml").write_text(
        f"task: my_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    train: {work}/tasks/train.jsonl\n"
        f"    test: {work}/tasks/test.jsonl\ntraining_split: train\ntest_split: test\nfewshot_split: train\n"
        "output_type: multiple_choice\ndoc_to_text: \"Text: {{text}} Label:\"\ndoc_to_choice: [\"no\", \"yes\"]\n"
        "doc_to_target: \"{{label}}\"\nmetric_list:\n  - metric: acc\n")


def tokenizer_json(work: Path) -> None:
    from tests.models import hf_tokenizer

    hf_tokenizer(work / "stand-in-tokenizer")
    (work / "stand-in-tokenizer" / "tokenizer.json").rename(work / "tokenizer.json")


def docs(work: Path) -> None:
    (work / "DOCS").mkdir()
    (work / "DOCS" / "documents.jsonl").symlink_to(ROOT / "train" / "samples" / "documents.jsonl")


def samples_cache(work: Path) -> None:
    from evalm.data_pipeline.samples.fetch import default_cache

    if default_cache().is_dir():
        (work / "DIR").symlink_to(default_cache())
    else:
        (work / "DIR").mkdir()


def main_job_tokens(work: Path) -> None:
    """What `evalm run` leaves that a line after it reads: the tokenizer stage's token shards, at the
    folder the shipped run file and the stage table name (runs/tiny/tokenizer), written by the stage's
    own command; its input is the shipped sample documents (the run's blend output is minutes away)."""
    from evalm.launcher.cli import main
    from evalm.launcher.run_file import load_run
    from evalm.launcher.stages import stage_commands

    (argv,) = stage_commands(load_run(ROOT / "configs" / "tiny.toml"), "tokenizer")
    argv[argv.index("--input") + 1] = str(ROOT / "train" / "samples" / "documents.jsonl")
    argv[argv.index("--output") + 1] = str(work / argv[argv.index("--output") + 1])
    assert main(argv) == 0


def main_job_export(work: Path) -> None:
    """The tuned model `evalm run` exports, at the folder the shipped run file and the stage table name
    (runs/tiny/export/msit): a one-layer byte-level EVALM stands in for the trained one."""
    from evalm.launcher.run_file import load_run
    from tests.models import byte_model

    byte_model(work / load_run(ROOT / "configs" / "tiny.toml").stage_dir("export") / "msit")
