"""Dedup benchmark, all ratios from one run.

1. Fingerprint throughput on one core (process pinned to one CPU, BLAS/OpenMP pools at 1 thread):
   the project's MinHash path vs datasketch.MinHash.bulk on the same token sets, signatures
   asserted identical first. Goal >= 3x. "cold": a fresh Fingerprinter (construction included)
   over the stream, as a dedup task starts; "warm": the same documents again, every token's hash
   cached (an upper bound on what the cache gives). datasketch has no cache: one figure. Times are
   this process's CPU time (time.process_time: on a shared machine, waiting for the core is not
   counted against either side), best of --repeats interleaved runs each. Measured on real text, the normalised
   documents of `evalm data samples` (data/samples/pile), when that folder exists, and always on
   synthetic text; each result names its text.
2. End-to-end filter + dedup throughput on 2 workers in MB/s of input, memory index vs Redis
   (a redis-server is started on a free loopback port when --redis-url is not given).
LSH recall on planted near-duplicates is the tests' (tests/data_pipeline/test_dedup.py), not timed here.

Synthetic Pile-like text: Zipf(1.1) words over a 200k vocabulary; `zipf_docs` and `redis_server` serve the
other dedup benchmarks too.
Run: python benchmarks/dedup.py [--samples data/samples] [--docs 4000] [--repeats 3] [--e2e-docs 4000]
     [--fingerprint-only]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import orjson
import redis
import zstandard
from datasketch import MinHash
from threadpoolctl import threadpool_limits

import timing
from evalm.data_pipeline.cli import main as data_main
from evalm.data_pipeline.dedup_cluster import free_ports
from evalm.data_pipeline.minhash import Fingerprinter, token_set
from evalm.data_pipeline.normalize import normalize

STOP = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()


def zipf_docs(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(letters[(i // 26**k) % 26] for k in range(4)) for i in range(200_000)]
    vocab = np.array(STOP + words)
    docs = []
    for _ in range(n):
        length = int(rng.integers(200, 1500))
        ranks = np.minimum(rng.zipf(1.1, size=length) - 1, len(vocab) - 1)
        docs.append(" ".join(vocab[ranks]))
    return docs


def sample_docs(samples: Path) -> list[str]:
    """The pile documents of `evalm data samples`, normalised as the filter stage writes them."""
    docs = []
    for path in sorted((samples / "pile").glob("*.jsonl.zst")):
        with path.open("rb") as f:
            raw = zstandard.ZstdDecompressor().stream_reader(f).read()
        docs += [normalize(orjson.loads(line)["text"])[0] for line in raw.splitlines()]
    return docs


@contextmanager
def one_core() -> Iterator[None]:
    """Pin this process to one CPU and thread pools to one thread (the e2e part uses 2 workers)."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        with threadpool_limits(1):
            yield
    finally:
        os.sched_setaffinity(0, cpus)


def fingerprint_throughput(docs: list[str], text: str, repeats: int) -> dict:
    sets = [token_set(d) for d in docs]  # tokenising is the same for both and not timed
    best = {"datasketch": np.inf, "cold": np.inf, "warm": np.inf}
    with one_core():
        for _ in range(repeats):  # interleaved, so a noisy neighbour hits both sides alike
            t = time.process_time()
            ref = MinHash.bulk([[w.encode("utf-8") for w in s] for s in sets], num_perm=128, seed=1)
            best["datasketch"] = min(best["datasketch"], time.process_time() - t)
            t = time.process_time()
            fp = Fingerprinter(128, 1)
            ours = fp.signatures(sets)
            best["cold"] = min(best["cold"], time.process_time() - t)
            t = time.process_time()
            again = fp.signatures(sets)
            best["warm"] = min(best["warm"], time.process_time() - t)
            expected = np.stack([m.hashvalues for m in ref])
            assert (ours == expected).all() and (again == expected).all(), "signatures differ from datasketch"
    n, t_ref = len(docs), best["datasketch"]
    return {"text": text, "documents": n, "token_set_entries": sum(map(len, sets)),
            "distinct_tokens": len(set().union(*sets)), "signatures_identical": True,
            "datasketch_bulk_docs_per_s": n / t_ref, "ours_cold_docs_per_s": n / best["cold"],
            "ours_warm_docs_per_s": n / best["warm"], "ratio_cold": t_ref / best["cold"],
            "ratio_warm": t_ref / best["warm"]}


@contextmanager
def redis_server(url: str | None = None) -> Iterator[str]:
    """`url`, or a private redis-server (loopback, a free port, no persistence) for the block: its URL."""
    if url:
        yield url
        return
    port = free_ports(1)[0]
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def write_shards(folder: Path, records: list[dict], shards: int) -> int:
    """`records` dealt round-robin into `shards` Pile-format files (jsonl.zst) in a new `folder`; their bytes."""
    lines = [orjson.dumps(r) + b"\n" for r in records]
    folder.mkdir(parents=True)
    for k in range(shards):
        (folder / f"{k:03d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b"".join(lines[k::shards])))
    return sum(map(len, lines))


def end_to_end(docs: list[str], redis_url: str | None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="evalm-bench-"))
    try:
        subsets = ["Pile-CC", "Wikipedia (en)", "Books3", "OpenWebText2"]
        megabytes = write_shards(work / "in", [{"text": d, "meta": {"pile_set_name": subsets[i % 4]}}
                                               for i, d in enumerate(docs)], 4) / 1e6
        cfg = work / "data.toml"
        cfg.write_text("[filter.default]\nmax_word_repetition = 1.0\nmax_char_repetition = 1.0\nmin_stopword_ratio = 0.0\n")
        result = {"input_MB": megabytes}
        for name, url in (("memory", None), ("redis", redis_url)):
            start = time.perf_counter()
            common = ["--tasks", "4", "--workers", "2"]
            assert data_main(["filter", "--input", str(work / "in"), "--output", str(work / f"f-{name}"), "--config", str(cfg), *common]) == 0
            extra = ["--redis-url", url] if url else []
            assert data_main(["dedup", "--input", str(work / f"f-{name}"), "--output", str(work / f"d-{name}"), *common, *extra]) == 0
            result[f"{name}_MB_per_s"] = megabytes / (time.perf_counter() - start)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(samples: Path = Path("data/samples"), docs: int = 4000, repeats: int = 3, fingerprint_only: bool = False,
         e2e_docs: int = 4000, redis_url: str | None = None) -> None:
    from loguru import logger  # datatrove's logger: keep the figures readable

    logger.remove()
    print(timing.machine())
    report = {"fingerprint": []}
    if (samples / "pile").is_dir():
        report["fingerprint"].append(fingerprint_throughput(sample_docs(samples), f"real: {samples}/pile", repeats))
    else:
        print(f"{samples}/pile not found (run `evalm data samples`): fingerprint figures on synthetic text only")
    synthetic = f"synthetic: Zipf(1.1) over 200k words, {docs} documents"
    report["fingerprint"].append(fingerprint_throughput(zipf_docs(docs, 0), synthetic, repeats))
    if not fingerprint_only:
        with redis_server(redis_url) as url:
            report["end_to_end_2_workers"] = end_to_end(zipf_docs(e2e_docs, 2), url)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__))
