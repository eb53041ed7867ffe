"""Dedup benchmark, all ratios from one run (issue 3).

1. Fingerprint throughput on one core: the project's MinHash path vs datasketch.MinHash.bulk on
   the same documents (signatures asserted identical). Goal >= 3x. Reported for one pass over a
   fresh stream (vocabulary cache cold at the start) and for a task's steady state (cache warm).
2. LSH candidate recall on planted pairs at J = 0.95, 0.97, 0.99 with bands x rows = 8 x 16.
   Goal >= 0.99.
3. End-to-end filter + dedup throughput on 2 workers in MB/s of input, memory index vs Redis
   (a redis-server is started on a free loopback port when --redis-url is not given).

Synthetic Pile-like text: Zipf(1.1) words over a 200k vocabulary (no corpus can be downloaded).
Run: python benchmarks/dedup.py [--docs 4000] [--pairs 400] [--e2e-docs 4000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from datasketch import MinHash

from data_pipeline import lsh
from data_pipeline.cli import main as data_main
from data_pipeline.minhash import Fingerprinter, lean, token_set

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


def fingerprint_throughput(docs: list[str]) -> dict:
    sets = [token_set(d) for d in docs]
    t = time.perf_counter()
    ref = MinHash.bulk([[w.encode("utf-8") for w in s] for s in sets], num_perm=128, seed=1)
    t_ref = time.perf_counter() - t
    fp = Fingerprinter(128, 1)
    t = time.perf_counter()
    ours = fp.signatures(sets)
    t_cold = time.perf_counter() - t
    t = time.perf_counter()
    fp.signatures(sets)
    t_warm = time.perf_counter() - t
    assert (ours == np.stack([m.hashvalues for m in ref])).all(), "signatures differ from datasketch"
    n = len(docs)
    return {"documents": n, "datasketch_bulk_docs_per_s": n / t_ref, "ours_cold_docs_per_s": n / t_cold,
            "ours_warm_docs_per_s": n / t_warm, "ratio_cold": t_ref / t_cold, "ratio_warm": t_ref / t_warm,
            "signatures_identical": True}


def recall(pairs: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    fp = Fingerprinter(128, 1)
    out = {}
    for j in (0.95, 0.97, 0.99):
        n = 2000  # set size; d tokens swapped gives J = (n - d) / (n + d)
        d = round(n * (1 - j) / (1 + j))
        found = 0
        index = lsh.make_index(128, 8, 16)
        for p in range(pairs):
            base = [f"p{j}-{p}-{i}" for i in range(n)]
            drop = set(rng.choice(n, d, replace=False).tolist())
            other = [t for i, t in enumerate(base) if i not in drop] + [f"q{j}-{p}-{i}" for i in range(d)]
            a, b = fp.signatures([set(base), set(other)])
            index.insert(("a", p), lean(a, 1))
            found += ("a", p) in index.query(lean(b, 1))
        out[str(j)] = {"true_jaccard": (n - d) / (n + d), "recall": found / pairs,
                       "expected": lsh.candidate_probability((n - d) / (n + d), 8, 16)}
    return out


def _redis_server() -> tuple[str, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            lsh.connect(url)
            break
        except lsh.RedisUnavailable:
            time.sleep(0.05)
    return url, proc


def end_to_end(docs: list[str], redis_url: str | None) -> dict:
    import orjson
    import zstandard

    work = Path(tempfile.mkdtemp(prefix="evalm-bench-"))
    try:
        (work / "in").mkdir()
        subsets = ["Pile-CC", "Wikipedia (en)", "Books3", "OpenWebText2"]
        lines = [orjson.dumps({"text": d, "meta": {"pile_set_name": subsets[i % 4]}}) for i, d in enumerate(docs)]
        for k in range(4):
            raw = b"".join(x + b"\n" for x in lines[k::4])
            (work / "in" / f"{k}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
        megabytes = sum(len(x) + 1 for x in lines) / 1e6
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--e2e-docs", type=int, default=4000)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    from loguru import logger  # datatrove's logger: keep the figures readable

    logger.remove()
    report = {"fingerprint": fingerprint_throughput(zipf_docs(args.docs, 0)), "lsh_recall": recall(args.pairs, 1)}
    url, proc = (args.redis_url, None) if args.redis_url else _redis_server()
    try:
        report["end_to_end_2_workers"] = end_to_end(zipf_docs(args.e2e_docs, 2), url)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
