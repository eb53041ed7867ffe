"""`evalm train metaicl`: MetaICL meta-training of a T5 with full, SAICL or FiD encoding (SAICL §3.3, App. C).

    evalm train metaicl --config configs/metaicl-tiny.toml --out runs/metaicl/saicl --metaicl.encoder=saicl

Each step draws `batch_size` episodes from the source tasks; an episode is k demonstrations and a
test item of one task, laid out exactly as `icl_eval.methods.encoder_decoder` lays out an evaluation prompt
(the same `PromptBuilder`, the same split at the label slot), and the loss is the decoder's
cross-entropy on the answer and its end token (MetaICL's objective, SAICL §3.3):
max E log p(y_test | x_1, y_1, ..., x_k, y_k, x_test). The same recipe trains every encoder.

Source and target tasks (`[metaicl]`): the synthetic family's rules (text/synthetic.py) drawn
from the seed stream `source_seed`; evaluation episodes are `episode(seed)` for the small seeds
of `evalm eval icl`, fresh rules never seen in training (held-out target tasks).

[loop note] The steps run in the project's one loop (train/loop.py, through `train.local`) with a
step of their own, `episode_step`: meta-training feeds structured episodes to an encoder-decoder
whose forward depends on the encoder kind, where the trainer's step reads token lines. What is shared
is shared: the loop, `finish_step` (the clip and the update), the `[optim]` section
(`train.config.OptimConfig`) and its schedule (`train.schedule.lr_at`). The output is a Hugging
Face folder that `evalm eval icl --hf-model OUT --tokenizer bytes` reads.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import torch
from pydantic.dataclasses import dataclass

from evalm.config_toolkit import (ConfigError, FROZEN, Parser, apply_overrides, build, check_overrides, check_sections,
                                  read_toml, report, shipped, split_overrides, to_dict)
from evalm.config_toolkit.machine import torch_threads
from evalm.storage import RunFolder, staged, write_atomic
from evalm.train.config import OptimConfig
from evalm.train.local import train_in_process
from evalm.train.loop import Loop, StepRecipe, Stepped, finish_step
from evalm.train.schedule import lr_of

DEFAULT_CONFIG = shipped("configs/metaicl-tiny.toml")


@dataclass(config=FROZEN, frozen=True)
class T5ModelConfig:
    """The tiny T5 built here (`icl_eval.models.t5.tiny_t5_config`), or a local T5 folder to start from."""

    init_from: str | None = None
    """A local T5 folder (e.g. T5-LM-adapt); when set the shape keys below are ignored."""
    d_model: int = 64
    """Width (d_kv = d_model / heads)."""
    layers: int = 2
    """Encoder layers, and as many decoder layers."""
    heads: int = 4
    """Attention heads."""
    d_ff: int = 128
    """Gated-GELU feed-forward width (T5.1.1)."""
    dropout: float = 0.0
    """T5 dropout rate (attention probabilities, residuals)."""


@dataclass(config=FROZEN, frozen=True)
class MetaIclConfig:
    """Meta-training (section `[metaicl]`)."""

    encoder: Literal["full", "saicl", "fid"] = "saicl"
    """The T5 baseline's full attention, SAICL's structured encoder, or Fusion-in-Decoder."""
    cross: Literal["none", "aligned"] = "none"
    """saicl: demo<->test position bias (icl_eval/models/t5.py [position note]); none is the paper's."""
    train_k: int = 16
    """Demonstrations per episode (the paper trains at 16 and 64)."""
    steps: int = 400
    """Optimizer steps."""
    batch_size: int = 16
    """Episodes per step (the paper: 4)."""
    seed: int = 0
    """Seed of the weight init."""
    source_seed: int = 1_000_003
    """Seed of the source rules' stream; evaluation episodes use small seeds (`episode(seed)`)."""
    log_every: int = 50
    """Print and record the loss every this many steps."""
    threads: int = 1
    """torch CPU threads. A tiny model is all small ops, where extra threads only add synchronisation
    (measured on the shared 2-core machine: 1 thread ~0.15 s/step, 2 threads 0.5-3 s/step)."""

    def __post_init__(self) -> None:
        if self.train_k < 1 or self.steps < 1 or self.batch_size < 1:
            raise ConfigError("train_k, steps and batch_size must be >= 1")


def episodes(rng: random.Random, syn, n: int) -> list[dict]:
    """n items of one fresh source rule (the synthetic family's own `draw_rule`)."""
    from evalm.text.synthetic import draw_rule

    rule = draw_rule(rng, syn)
    inputs = list(rule)
    return [{"x": x, "label": rule[x]} for x in (rng.choice(inputs) for _ in range(n))]


def make_batch(lm, prompt, syn, rng: random.Random, k: int, batch_size: int):
    """(demo segments, test segments, decoder rows) of `batch_size` episodes, in the evaluation layout."""
    from evalm.icl_eval.methods.encoder_decoder import demo_segments, split_item

    demos, tests, targets = [], [], []
    for _ in range(batch_size):
        rows = episodes(rng, syn, k + 1)
        demos.append(demo_segments(prompt, [prompt.demo(i, r) for i, r in enumerate(rows[:k])]))
        item = prompt.test_item(k, rows[k], k)
        test, cand = split_item(lm, prompt, item)[item.gold]
        tests.append(test)
        targets.append(cand.tokens)
    return demos, tests, targets


def loss_on(lm, kind: str, cross: str, demos, tests, targets) -> torch.Tensor:
    """Mean cross-entropy of the answer tokens and their end token given the encoded episode."""
    from evalm.icl_eval.models.t5 import pad_rows

    hidden, mask = lm.encode(kind, demos, tests, cross)
    ids, keep = pad_rows([t[:-1] for t in targets], lm.pad_id)
    labels, lab_keep = pad_rows([t[1:] for t in targets], lm.pad_id)
    labels = labels.masked_fill(~lab_keep, -100)
    out = lm.model(encoder_outputs=(hidden,), attention_mask=mask.long(), decoder_input_ids=ids.to(lm.device),
                   labels=labels.to(lm.device))
    return out.loss


class Episodes:
    """The training episodes of one run, batch after batch from one seeded stream, and their loss."""

    def __init__(self, lm, prompt, syn, rng: random.Random, cfg: MetaIclConfig):
        self.lm, self.prompt, self.syn, self.rng, self.cfg = lm, prompt, syn, rng, cfg

    def next_batch(self):
        return make_batch(self.lm, self.prompt, self.syn, self.rng, self.cfg.train_k, self.cfg.batch_size)

    def loss(self) -> torch.Tensor:
        """The mean cross-entropy of the answers of the next batch (`loss_on`)."""
        return loss_on(self.lm, self.cfg.encoder, self.cfg.cross, *self.next_batch())


def episode_step(model, optimizer, episodes: Episodes, runtime, recipe: StepRecipe) -> tuple[float, float, bool]:
    """One optimizer step of meta-training (train/loop.py's `Step` contract): one batch of episodes,
    its mean answer cross-entropy, the clip and the update of `finish_step`."""
    loss = episodes.loss()
    loss.backward()
    return finish_step(model, optimizer, runtime, loss.detach().double(), 1.0, recipe.clip_norm)


def build_lm(model_cfg: T5ModelConfig, seed: int):
    from evalm.icl_eval.models.t5 import T5Shape, load_t5, tiny_t5

    if model_cfg.init_from:
        return load_t5(model_cfg.init_from)
    return tiny_t5(seed=seed, shape=T5Shape(d_model=model_cfg.d_model, layers=model_cfg.layers, heads=model_cfg.heads,
                                            d_ff=model_cfg.d_ff, dropout=model_cfg.dropout))


def train(model_cfg: T5ModelConfig, cfg: MetaIclConfig, optim: OptimConfig, syn, out: Path | None = None):
    """Meta-train; returns the model (a `T5LM`) and the logged records."""
    with torch_threads(cfg.threads):
        return _train(model_cfg, cfg, optim, syn, out)


def _train(model_cfg: T5ModelConfig, cfg: MetaIclConfig, optim: OptimConfig, syn, out: Path | None):
    from evalm.icl_eval.tasks.prompts import PromptBuilder
    from evalm.icl_eval.tasks.synthetic import synthetic_task

    lm = build_lm(model_cfg, cfg.seed)
    episodes = Episodes(lm, PromptBuilder(synthetic_task(syn), lm.tokenizer), syn, random.Random(cfg.source_seed), cfg)
    torch.manual_seed(cfg.seed)
    model = lm.model
    opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                            weight_decay=optim.weight_decay)
    records, t0 = [], time.perf_counter()

    def log(stepped: Stepped) -> None:
        if stepped.done % cfg.log_every == 0 or stepped.done == cfg.steps:
            rec = {"step": stepped.done, "loss": stepped.loss, "lr": stepped.lr, "seconds": time.perf_counter() - t0}
            records.append(rec)
            print(f"metaicl {cfg.encoder} step {rec['step']}/{cfg.steps} loss {rec['loss']:.4f} "
                  f"{rec['seconds']:.0f}s", flush=True)

    loop = Loop(0, cfg.steps, episode_step, StepRecipe(clip_norm=optim.clip_norm), lr_of(optim, cfg.steps), log)
    train_in_process(model, episodes, opt, loop)
    if out is not None:
        with staged(out) as stage:  # moved into OUT complete, config.json last
            lm.save(stage)
            write_atomic(stage / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    return lm, records


def load_configs(path: str | Path | None, overrides: Sequence[str]):
    """([model], [metaicl], [optim], [synthetic]) of a TOML file with `section.key=value` overrides."""
    from evalm.text.synthetic import SyntheticConfig

    where = str(path or "defaults")
    check_overrides(overrides, {"model": T5ModelConfig, "metaicl": MetaIclConfig, "optim": OptimConfig,
                                "synthetic": SyntheticConfig})
    data = apply_overrides(read_toml(path) if path else {}, overrides)
    check_sections(data, ("model", "metaicl", "optim", "synthetic"), where)
    return (build(T5ModelConfig, data.get("model"), where=f"{where} [model]"),
            build(MetaIclConfig, data.get("metaicl"), where=f"{where} [metaicl]"),
            build(OptimConfig, data.get("optim"), where=f"{where} [optim]"),
            build(SyntheticConfig, data.get("synthetic"), where=f"{where} [synthetic]"))


def main(argv: Sequence[str] | None = None) -> int:
    try:  # the one override syntax of every command: --set section.key=value, or --section.key=value
        overrides, rest = split_overrides(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        return report("evalm train metaicl", err)
    p = Parser(prog="evalm train metaicl", description=__doc__.split("\n")[0],
               epilog="Any field: --set section.key=value, or --section.key=value (e.g. --metaicl.encoder=fid).")
    p.add_argument("--config", default=str(DEFAULT_CONFIG) if DEFAULT_CONFIG.is_file() else None,
                   help=f"TOML with [model] [metaicl] [optim] [synthetic] (default: {DEFAULT_CONFIG.name})")
    p.add_argument("--out", required=True, help="output folder: a Hugging Face T5 folder plus metrics.jsonl (required)")
    args = p.parse_args(rest)
    try:
        model_cfg, cfg, optim, syn = load_configs(args.config, overrides)
        with RunFolder(args.out, "evalm train metaicl").held() as folder:  # a new or empty folder, or its own
            folder.write_json("metaicl.json", {"model": to_dict(model_cfg), "metaicl": to_dict(cfg),
                                               "optim": to_dict(optim), "synthetic": to_dict(syn)})
            train(model_cfg, cfg, optim, syn, folder.path)
    except Exception as err:  # noqa: BLE001 - the one rule: a user error in one line, else a bug with its log
        return report("evalm train metaicl", err)
    print(f"wrote {args.out} (evaluate: evalm eval icl --hf-model {args.out} --tokenizer bytes --task synthetic)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
