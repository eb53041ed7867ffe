"""`evalm data dedup`: fuzzy dedup as restartable steps (EVALM Appendix A.1).

  fingerprints  N tasks  MinHash of each document's token set -> fingerprints/<rank>.npz (the
                         durable fingerprint store: no Redis copy, see docs/data_pipeline.md)
  lsh           memory: 1 task, query-then-insert over all fingerprints
  lsh_insert    Redis (one server, several, or a cluster: dedup_index.py): N tasks add their
                documents to the band hashes (idempotent HSETs) under the run's namespace, and
                record themselves on each band's node with that node's run_id
  lsh_query     Redis: N tasks query their documents; a pair is kept from its larger id's side
                -> candidates/<rank>.npy, each unordered pair exactly once; refuses an index
                that lost insert tasks in a Redis restart
  tokens        N tasks: token-set hashes of the documents in a candidate pair (dedup_verify.py)
  verify        N tasks: exact Jaccard > threshold on a 1/N slice of the pairs -> edges/<rank>.npy
  graph         1 task: scipy components of the edges, survivor by priority (no document read)
                -> graph/removals.jsonl, graph/stats.json
  write         N tasks: documents/<rank> (survivors), removed/<rank> (with component, survivor)
  manifest      1 task; with Redis, records the index's bytes per node and per document, then
                deletes the run's keys (unless --keep-index)

Dense ids number the documents in task order (runner.read_all), the same in every step.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from datatrove.pipeline.base import PipelineStep

from evalm.config_toolkit import to_dict
from evalm.storage import Secret, redact, replaced, write_atomic
from evalm.data_pipeline import dedup_graph, dedup_index, dedup_verify, lsh
from evalm.data_pipeline.config import DedupConfig
from evalm.data_pipeline.fingerprint_store import fingerprint_path, load_fingerprints, offsets
from evalm.data_pipeline.minhash import SCHEME, Fingerprinter, lean, token_set
from evalm.data_pipeline.runner import (
    Manifest,
    Step,
    merge_counts,
    reader,
    task_stats,
    write_errors,
    write_json,
    writer,
)


class DedupStep(PipelineStep):
    """A dedup step: it knows the stage folder, the config, the task count and the Redis URL (if any), held
    as a `storage.Secret`: datatrove records every attribute of a step in logs/*/executor.json, and the
    URL's password must not reach it (nor any message: `str` of a Secret is the redacted URL)."""

    def __init__(self, output: str, config: DedupConfig, tasks: int = 1, redis_url: Secret | None = None):
        super().__init__()
        self.output, self.config, self.tasks, self.redis_url = output, config, tasks, redis_url


FINGERPRINT_BATCH = 1000
"""Documents whose token sets a fingerprint task holds at once (the signatures are the same at any size)."""


class FingerprintStep(DedupStep):
    name = "fingerprints"

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        output, c = Path(self.output), self.config
        source = reader(output)
        ids, subsets, lengths, sets, parts = [], [], [], [], []
        fingerprinter = Fingerprinter(c.num_perm, c.seed)
        for doc in source.run(None, rank, world_size):
            ids.append(doc.id)
            subsets.append(doc.subset)
            lengths.append(len(doc.text))
            sets.append(token_set(doc.text))
            if len(sets) == FINGERPRINT_BATCH:  # token sets are ~50 B a token: never hold a task's
                parts.append(fingerprinter.signatures(sets))
                sets = []
        parts.append(fingerprinter.signatures(sets))
        signatures = np.concatenate(parts)
        path = fingerprint_path(output, rank)
        with replaced(path) as tmp, open(tmp, "wb") as f:  # np.savez on a handle: no ".npz" appended, same bytes
            np.savez(f, signatures=signatures, ids=np.array(ids, dtype=str), subsets=np.array(subsets, dtype=str),
                     lengths=np.array(lengths, dtype=np.int64), scheme=np.array(SCHEME), seed=np.array(c.seed),
                     num_perm=np.array(c.num_perm))
        write_errors(output, rank, source.errors, source.records, c.max_error_fraction)
        write_json(output / "stats" / "fingerprints" / f"{rank:05d}.json",
                   {"documents_in": dict(Counter(subsets)), "errors": len(source.errors)})


def _write_candidates(output: Path, rank: int, pairs: list[tuple[int, int]]) -> None:
    path = output / "candidates" / f"{rank:05d}.npy"
    arr = np.array(sorted(set(pairs)), dtype=np.int64).reshape(-1, 2)
    with replaced(path) as tmp, open(tmp, "wb") as f:
        np.save(f, arr, allow_pickle=False)


class MemoryLshStep(DedupStep):
    """One pass, query then insert: each candidate pair (earlier, later) is found exactly once."""

    name = "lsh"

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        output, c = Path(self.output), self.config
        index = lsh.make_index(c.num_perm, c.bands, c.rows)
        pairs, dense = [], 0
        for task in range(self.tasks):
            for sig in load_fingerprints(output, task, c)["signatures"]:
                m = lean(sig, c.seed)
                pairs.extend((other, dense) for other in index.query(m))
                index.insert(dense, m, check_duplication=False)
                dense += 1
        # every pair is in this one file: drop the per-task files of an earlier Redis launch
        for stale in (output / "candidates").glob("*.npy"):
            if stale.name != "00000.npy":
                stale.unlink()
        _write_candidates(output, 0, pairs)


class RedisStep(DedupStep):
    """An LSH step over the Redis index (dedup_index.py): the index, the task's first dense id, its signatures."""

    def redis(self, rank: int) -> tuple[dedup_index.BandIndex, int, np.ndarray]:
        output, c = Path(self.output), self.config
        bounds = offsets(output, self.tasks)
        servers = dedup_index.open_servers(self.redis_url.reveal(), c.bands)
        index = dedup_index.BandIndex(servers, lsh.basename_for(output), c.bands, c.rows, int(bounds[-1]))
        return index, int(bounds[rank]), load_fingerprints(output, rank, c)["signatures"]


class RedisInsertStep(RedisStep):
    name = "lsh_insert"

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        index, first, signatures = self.redis(rank)
        index.insert(rank, first, signatures)  # HSET of a present field is a no-op: a rerun is idempotent


class RedisQueryStep(RedisStep):
    name = "lsh_query"

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        index, first, signatures = self.redis(rank)
        with lsh.guarded(self.redis_url.reveal(), f"lsh_query task {rank}"):
            self.check_index(index)
            # both ends of a pair find each other; keep it from the larger id's side only
            pairs = [(other, me) for other, me in index.query(first, signatures) if other < me]
            self.check_index(index)  # a restart while querying emptied a node
        _write_candidates(Path(self.output), rank, pairs)

    def check_index(self, index: dedup_index.BandIndex) -> None:
        """Refuse an index that lost insert tasks; unmark them so the relaunch redoes them."""
        missing = index.missing_inserts(self.tasks)
        if not missing:
            return
        unmark(Path(self.output), missing)
        raise lsh.RedisUnavailable(
            f"Redis at {self.redis_url} no longer holds the buckets of lsh_insert task(s) {missing} of this "
            f"run (a node restarted without persistence, or its keys were removed). {lsh.ADVICE}.")


class GraphStep(DedupStep):
    """Components of the verified edges; names, subsets and lengths only of grouped documents."""

    name = "graph"

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        output, c = Path(self.output), self.config
        n = int(offsets(output, self.tasks)[-1])
        edges = np.concatenate([np.empty((0, 2), dtype=np.int64),
                                *(np.load(f, allow_pickle=False) for f in sorted((output / "edges").glob("*.npy")))])
        labels = dedup_graph.components(n, edges)
        nodes = dedup_graph.grouped(labels)
        ids, subsets, lengths = self.metadata(output, nodes)
        grouped_labels = labels[nodes].tolist()
        removed = dedup_graph.survivors(grouped_labels, subsets, lengths, ids, c.priority)  # positions in nodes
        rows = [
            {"dense": int(nodes[k]), "id": ids[k], "subset": subsets[k], "component": grouped_labels[k],
             "survivor": ids[s], "survivor_subset": subsets[s]}
            for k, s in sorted(removed.items())
        ]
        write_atomic(output / "graph" / "removals.jsonl", b"".join(orjson.dumps(r) + b"\n" for r in rows))
        candidates = sum(len(f) for f in dedup_verify.candidate_rows(output))
        write_json(output / "graph" / "stats.json",
                   graph_stats(candidates, len(edges), grouped_labels, subsets, removed, lengths))

    def metadata(self, output: Path, nodes: np.ndarray) -> tuple[list[str], list[str], list[int]]:
        """ids, subsets, lengths of the given dense ids, from each task's fingerprint file."""
        bounds = offsets(output, self.tasks)
        ids, subsets, lengths = [], [], []
        for t in range(self.tasks):
            local = nodes[(nodes >= bounds[t]) & (nodes < bounds[t + 1])] - bounds[t]
            if len(local):
                fp = load_fingerprints(output, t, self.config)
                ids += fp["ids"][local].tolist()
                subsets += fp["subsets"][local].tolist()
                lengths += fp["lengths"][local].tolist()
        return ids, subsets, lengths


def graph_stats(candidates: int, n_edges: int, labels, subsets, removed, lengths) -> dict[str, Any]:
    """Dedup metrics over the grouped documents, DM Mathematics' component sizes on their own."""
    big = Counter(labels)
    dm_labels = {labels[k] for k, s in enumerate(subsets) if s == "DM Mathematics"}
    dm = sorted((size for label, size in big.items() if label in dm_labels), reverse=True)
    return {
        "candidates": int(candidates),
        "verified_edges": int(n_edges),
        "verification_rejection_rate": 1 - n_edges / candidates if candidates else 0.0,
        "components_with_duplicates": len(big),
        "component_size_histogram": {str(k): v for k, v in sorted(Counter(big.values()).items())},
        "documents_removed": dict(Counter(subsets[k] for k in removed)),
        "characters_removed": dict(sum((Counter({subsets[k]: lengths[k]}) for k in removed), Counter())),
        "dm_mathematics_component_sizes": dm[:100],
    }


class WriteStep(DedupStep):
    name = "write"

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        output, c = Path(self.output), self.config
        first = int(offsets(output, self.tasks)[rank])
        removals = {}
        for line in (output / "graph" / "removals.jsonl").read_bytes().splitlines():
            row = orjson.loads(line)
            removals[row["dense"]] = row
        kept, removed = writer(output, "documents", c.compression), writer(output, "removed", c.compression)
        counts = {"documents_kept": Counter(), "documents_removed": Counter()}
        with kept, removed:
            for i, doc in enumerate(reader(output).run(None, rank, world_size)):
                row = removals.get(first + i)
                if row is None:
                    kept.write(doc, rank)
                    counts["documents_kept"][doc.subset] += 1
                else:
                    doc.annotations.update(dedup_component=row["component"], dedup_survivor=row["survivor"])
                    removed.write(doc, rank)
                    counts["documents_removed"][doc.subset] += 1
        write_json(output / "stats" / "write" / f"{rank:05d}.json", {k: dict(v) for k, v in counts.items()})


def summarize(output: Path, redis_url: Secret | None = None, tasks: int = 1, bands: int = 8,
              keep_index: bool = False) -> dict[str, Any]:
    """The manifest's stats; with Redis, the run's keys are deleted here, at completion."""
    import json

    summary = {
        "stats": merge_counts(task_stats(output, "fingerprints") + task_stats(output, "write")),
        "graph": json.loads((output / "graph" / "stats.json").read_text()),
    }
    if redis_url:
        summary["redis"] = index_summary(output, redis_url.reveal(), tasks, bands, keep_index)
    return summary


def index_summary(output: Path, redis_url: str, tasks: int, bands: int, keep_index: bool) -> dict[str, Any]:
    """The index's keys and bytes per node (Redis' MEMORY USAGE) and per document, then its deletion."""
    namespace = lsh.basename_for(output)
    nodes = dedup_index.measure(redis_url, namespace, bands)
    total = sum(n["bytes"] for n in nodes.values())
    documents = int(offsets(output, tasks)[-1])
    removed = 0 if keep_index else dedup_index.drop(redis_url, namespace, bands)
    return {"namespace": namespace.decode(), "nodes": nodes, "index_bytes": total,
            "index_bytes_per_document": total / max(documents, 1), "index_kept": keep_index, "keys_removed": removed}


def steps(output: Path, config: DedupConfig, tasks: int, redis_url: str | None, *, fresh: bool = True,
          keep_index: bool = False) -> list[Step]:
    """The stage's steps; a fresh folder with Redis first clears what a dead run left in its namespace. The
    steps hold the URL as a Secret (see DedupStep)."""
    out, secret = str(output), Secret(redis_url) if redis_url else None
    if redis_url:
        dedup_index.open_servers(redis_url, config.bands)  # fail fast, before any task starts
        if fresh:
            dedup_index.drop(redis_url, lsh.basename_for(output), config.bands)
        else:
            unmark_lost_inserts(output, tasks, redis_url, config)
        index = [Step("lsh_insert", tasks, RedisInsertStep(out, config, tasks, secret)),
                 Step("lsh_query", tasks, RedisQueryStep(out, config, tasks, secret))]
    else:
        index = [Step("lsh", 1, MemoryLshStep(out, config, tasks))]
    return [
        Step("fingerprints", tasks, FingerprintStep(out, config, tasks)),
        *index,
        Step("tokens", tasks, dedup_verify.TokenStep(out, config, tasks)),
        Step("verify", tasks, dedup_verify.VerifyStep(out, config, tasks)),
        Step("graph", 1, GraphStep(out, config, tasks)),
        Step("write", tasks, WriteStep(out, config, tasks)),
        Step("manifest", 1, Manifest(out, partial(summarize, redis_url=secret, tasks=tasks, bands=config.bands,
                                                          keep_index=keep_index))),
    ]


def unmark_lost_inserts(output: Path, tasks: int, redis_url: str, config: DedupConfig) -> None:
    """On a relaunch, insert tasks marked complete whose buckets a node lacks (it restarted) are
    unmarked so that this launch redoes them, unless every query task is already done."""
    logs = output / "logs"
    if len(list((logs / "lsh_query" / "completions").glob("*"))) == tasks:
        return
    if len(list((logs / "fingerprints" / "completions").glob("*"))) < tasks:
        return  # no insert task has run yet
    servers = dedup_index.open_servers(redis_url, config.bands)
    index = dedup_index.BandIndex(servers, lsh.basename_for(output), config.bands, config.rows,
                                  int(offsets(output, tasks)[-1]))
    with lsh.guarded(redis_url, "checking the index"):
        unmark(output, index.missing_inserts(tasks))


def unmark(output: Path, ranks: list[int]) -> None:
    """Remove the completion markers of these insert tasks: the next launch runs them again."""
    for r in ranks:
        (output / "logs" / "lsh_insert" / "completions" / f"{r:05d}").unlink(missing_ok=True)


def settings(config: DedupConfig, redis_url: str | None, output: Path) -> dict[str, Any]:
    """What config.json (and so manifest.json) records of the stage: the URL with its password redacted."""
    namespace = lsh.basename_for(output).decode() if redis_url else None
    return {"config": to_dict(config), "index": {"kind": "redis" if redis_url else "memory",
                                                 "redis_url": redact(redis_url) if redis_url else None,
                                                 "namespace": namespace}}
