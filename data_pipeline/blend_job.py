"""`evalm data blend`: token budgets per subset -> shuffled heterogeneous shards (docs/data_pipeline.md).

  plan      1 task: token estimate and subset of every document, blend.plan with the seed
            -> plan/copies.npy (dense ids in output order), blend_report.json
  write     N tasks: task r writes shard r = the r-th equal cut of the shuffled copies
            -> documents/<rank>.jsonl.zst (each task reads the inputs and keeps its copies)
  manifest  1 task
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.pipeline.base import PipelineStep

from evalm.config_toolkit import to_dict
from evalm.storage import replaced
from evalm.data_pipeline import blend
from evalm.data_pipeline.config import BlendConfig, Budgets
from evalm.data_pipeline.runner import Manifest, Step, read_all, write_errors, write_json, writer


class PlanStep(PipelineStep):
    name = "plan"

    def __init__(self, output: str, config: BlendConfig, budgets: Budgets):
        super().__init__()
        self.output, self.config, self.budgets = output, config, budgets

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        output, c = Path(self.output), self.config
        subsets, tokens, errors = [], [], []
        for _, doc in read_all(output, errors):
            subsets.append(doc.subset)
            tokens.append(blend.estimate_tokens(doc.text, c.bytes_per_token))
        result = blend.plan(subsets, tokens, self.budgets, c.seed)
        with replaced(output / "plan" / "copies.npy") as tmp, open(tmp, "wb") as f:
            np.save(f, result.copies, allow_pickle=False)
        write_errors(output, 0, errors, len(subsets) + len(errors), c.max_error_fraction)
        write_json(output / "blend_report.json", {"subsets": result.report, "documents_out": int(len(result.copies)),
                                                  "tokens_out": int(sum(r["actual_tokens"] for r in result.report.values()))})


class WriteStep(PipelineStep):
    name = "write"

    def __init__(self, output: str, config: BlendConfig, shards: int):
        super().__init__()
        self.output, self.config, self.shards = output, config, shards

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        output = Path(self.output)
        copies = np.load(output / "plan" / "copies.npy", allow_pickle=False)
        mine = copies[blend.shard_of(np.arange(len(copies)), len(copies), self.shards) == rank]
        wanted = set(mine.tolist())
        docs = {n: doc for n, doc in read_all(output) if n in wanted}
        with writer(output, "documents", self.config.compression) as out:
            for n in mine.tolist():
                out.write(docs[n], rank)
        write_json(output / "stats" / "write" / f"{rank:05d}.json", {"documents_out": int(len(mine))})


def summarize(output: Path) -> dict[str, Any]:
    return {"report": json.loads((output / "blend_report.json").read_text())}


def steps(output: Path, config: BlendConfig, budgets: Budgets, shards: int) -> list[Step]:
    out = str(output)
    return [
        Step("plan", 1, PlanStep(out, config, budgets)),
        Step("write", shards, WriteStep(out, config, shards)),
        Step("manifest", 1, Manifest(out, summarize)),
    ]


def settings(config: BlendConfig, budgets: Budgets) -> dict[str, Any]:
    return {"config": to_dict(config), "budgets": to_dict(budgets)}
