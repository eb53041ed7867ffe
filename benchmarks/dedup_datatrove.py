"""Side by side: `evalm data dedup` (memory, one Redis, a 3-node Redis Cluster) vs datatrove's MinHash.

Same corpus, same 1-gram shingles, same 8 bands x 16 rows, same task count, one worker each.
datatrove runs its four stages (MinhashDedupSignature, MinhashDedupBuckets, MinhashDedupCluster,
MinhashDedupFilter) with its own word tokenizer slot given a whitespace split (its English one
needs spaCy; this corpus is lower-case words separated by spaces, so both see the same token
sets). Each contender runs in a fresh process; the figures are its wall time and the peak RSS of
that process (VmHWM) and of its children (ru_maxrss), and the index's memory: Redis' MEMORY USAGE of the
run's keys (the manifest's `redis.index_bytes`) for ours, the bytes of datatrove's signature and
bucket files on disk for datatrove (its index is files, not memory), inside the RSS for ours in
memory.

Corpus (truth known): groups of a base document with two close variants (set Jaccard 0.97 and
0.96 to the base: one of the three must survive) and far variants at J = 0.90, 0.85, 0.80 (below
the 0.95 threshold: must all survive), plus unrelated documents. Synthetic words: Zipf(1.1) over
200k words (benchmarks/dedup.py). Recall: removed close documents / (2 per group). False
removals: far variants or unrelated documents removed, plus groups that lost all three.

Run: python benchmarks/dedup_datatrove.py [--docs 20000] [--tasks 4] [--no-cluster]
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import orjson
import zstandard

import timing
from dedup import redis_server, write_shards, zipf_docs  # benchmarks/dedup.py (this folder is sys.path[0] as a script)

CLOSE = (0.97, 0.96)
FAR = (0.90, 0.85, 0.80)
GROUP = 1 + len(CLOSE) + len(FAR)


def variant(words: list[str], jaccard: float, tag: str, rng: random.Random) -> list[str]:
    """words with d of its distinct words replaced everywhere by fresh ones: J = (n - d) / (n + d)."""
    distinct = sorted(set(words))
    d = max(1, round(len(distinct) * (1 - jaccard) / (1 + jaccard)))
    fresh = {w: f"{tag}x{i}" for i, w in enumerate(rng.sample(distinct, d))}
    return [fresh.get(w, w) for w in words]


def corpus(folder: Path, docs: int, tasks: int) -> dict[str, str]:
    """Writes `tasks` shards; returns id -> kind (base, close, far-<J>, unique)."""
    rng = random.Random(0)
    groups = docs // (4 * GROUP)  # a fifth of the documents in groups
    texts = zipf_docs(groups + docs - groups * GROUP, seed=11)
    truth, records = {}, []

    def add(doc_id: str, words: list[str], kind: str) -> None:
        truth[doc_id] = kind
        records.append({"id": doc_id, "text": " ".join(words), "meta": {"pile_set_name": "Pile-CC"}})

    for g in range(groups):
        base = texts[g].split()
        add(f"g{g}-base", base, "base")
        for j in CLOSE:
            add(f"g{g}-c{j}", variant(base, j, f"g{g}c{j}", rng), "close")
        for j in FAR:
            add(f"g{g}-f{j}", variant(base, j, f"g{g}f{j}", rng), f"far-{j}")
    for u, text in enumerate(texts[groups:]):
        add(f"u{u}", text.split(), "unique")
    rng.shuffle(records)
    write_shards(folder, records, tasks)
    return truth


def run_ours(work: Path, tasks: int, redis_url: str | None) -> dict:
    from evalm.data_pipeline.cli import main as data_main

    extra = ["--redis-url", redis_url] if redis_url else []
    assert data_main(["dedup", "--input", str(work / "in"), "--output", str(work / "out"), "--tasks", str(tasks),
                      *extra]) == 0
    removed = [orjson.loads(x)["id"] for f in sorted((work / "out" / "removed").glob("*.jsonl*"))
               for x in zstandard.ZstdDecompressor().decompressobj().decompress(f.read_bytes()).splitlines() if x]
    index = json.loads((work / "out" / "manifest.json").read_text()).get("redis", {})
    return {"removed": removed, "index_bytes": index.get("index_bytes"), "index_nodes": index.get("nodes")}


def run_datatrove(work: Path, tasks: int) -> dict:
    from datatrove.executor.local import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                                  MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig
    from datatrove.utils.word_tokenizers import WordTokenizer

    class SplitTokenizer(WordTokenizer):  # datatrove's slot for a custom tokenizer
        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    # xxhash, datatrove's default shingle hash, fails here on str input with the installed xxhash
    # (TypeError: Strings must be encoded before hashing): its other choice, SHA-1, as ours uses
    config = MinhashConfig(n_grams=1, num_buckets=8, hashes_per_bucket=16, hash_config=HashConfig(precision=64, hash_fc="sha1"))
    m, logs = work / "minhash", work / "logs"

    def reader():
        return JsonlReader(str(work / "in"), glob_pattern="*.jsonl.zst", compression="zstd")

    stages = [
        ([reader(), MinhashDedupSignature(str(m / "signatures"), config=config, language=SplitTokenizer())], tasks),
        ([MinhashDedupBuckets(str(m / "signatures"), str(m / "buckets"), config=config)], config.num_buckets),
        ([MinhashDedupCluster(str(m / "buckets"), str(m / "remove_ids"), config=config)], 1),
        ([reader(), MinhashDedupFilter(str(m / "remove_ids"), exclusion_writer=JsonlWriter(str(work / "removed"))),
          JsonlWriter(str(work / "kept"))], tasks),
    ]
    for i, (pipeline, n) in enumerate(stages):
        LocalPipelineExecutor(pipeline, tasks=n, workers=1, logging_dir=str(logs / str(i))).run()
    import gzip

    removed = [orjson.loads(x)["id"] for f in sorted((work / "removed").glob("*.jsonl.gz"))
               for x in gzip.decompress(f.read_bytes()).splitlines() if x]
    on_disk = sum(p.stat().st_size for folder in ("signatures", "buckets") for p in (m / folder).rglob("*") if p.is_file())
    return {"removed": removed, "index_bytes": on_disk, "index_nodes": None}


def contender(run: str, work: str, tasks: int, redis_url: str | None) -> dict:
    """One child: one contender's result, time and peak RSS."""
    from loguru import logger

    logger.remove()
    start = time.perf_counter()
    out = run_datatrove(Path(work), tasks) if run == "datatrove" else run_ours(Path(work), tasks, redis_url)
    seconds = time.perf_counter() - start
    # VmHWM, not RUSAGE_SELF: Linux carries the forking parent's RSS high-water mark across exec
    # into ru_maxrss, so every contender would read at least the parent's size
    rss_mib = max(timing.status_mib("VmHWM"), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    return out | {"seconds": seconds, "peak_rss_mib": rss_mib}


def score(removed: list[str], truth: dict[str, str]) -> dict:
    gone = set(removed)
    groups = {k.split("-")[0] for k, kind in truth.items() if kind == "base"}
    close_removed = sum(1 for k in gone if truth[k] in ("base", "close"))
    all_lost = sum(1 for g in groups if all(k in gone for k in truth if k.startswith(g + "-") and
                                            truth[k] in ("base", "close")))
    far = {f"far-{j}": sum(1 for k in gone if truth[k] == f"far-{j}") / len(groups) for j in FAR}
    false = sum(1 for k in gone if truth[k].startswith("far") or truth[k] == "unique") + all_lost
    return {"removed": len(gone), "recall": min(close_removed, 2 * len(groups)) / (2 * len(groups)),
            "false_removals": false, "far_variant_removal_rate": far, "groups_that_lost_all": all_lost}


def main(docs: int = 20000, tasks: int = 4, no_cluster: bool = False) -> None:
    from evalm.data_pipeline.dedup_cluster import LocalCluster, binaries

    print(timing.machine())
    root = Path(tempfile.mkdtemp(prefix="evalm-vs-datatrove-"))
    try:
        with redis_server() as url, LocalCluster(root / "cluster") if binaries() and not no_cluster else nullcontext() as cluster:
            truth = corpus(root / "in", docs, tasks)
            runs = {"ours_memory": None, "ours_redis": url, "datatrove": None}
            runs |= {"ours_cluster_3_nodes": cluster.url} if cluster is not None else {}
            report = {"documents": len(truth), "groups": sum(v == "base" for v in truth.values()), "tasks": tasks}
            for name, u in runs.items():
                work = root / name
                work.mkdir()
                (work / "in").symlink_to(root / "in")
                out = timing.child(__file__, "contender", "datatrove" if name == "datatrove" else "ours", str(work), tasks, u)
                report[name] = {k: v for k, v in out.items() if k != "removed"} | score(out["removed"], truth)
        base = report["datatrove"]
        for name in runs:
            report[name]["time_vs_datatrove"] = report[name]["seconds"] / base["seconds"]
            report[name]["rss_vs_datatrove"] = report[name]["peak_rss_mib"] / base["peak_rss_mib"]
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__, {"contender": contender}))
