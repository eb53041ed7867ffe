"""`evalm eval needle-ranks`: where a needle's chunk ranks among the chunks a query may select, by three scores.

    evalm eval needle-ranks --hf-model runs/convert/smollm2-eva-rope --tasks passkey --lengths 8192 --depths 0,50

Selection (docs/eva.md, "Selection") reads the k chunks a score ranks highest; it can find a needle only where
that score ranks the needle's chunk in the top k. This reads, at the last prompt token (where the answer is
generated) of each recall item (the items of `evalm eval recall`, the same seeds), at every EVA layer and for
every group of query heads sharing a K/V head (their scores summed, as selection sums them), the rank of the
best-placed chunk holding the needle's tokens among the candidates (the visible chunks wholly before the
window, `Tiling.candidate_count`) by

- `summary`: the summary's logit s·q·k̃_r in EVA's joint softmax (`select_by = "summary"`);
- `bound`: Quest's bound s·Σ_d max(q_d·min_j k_jd, q_d·max_j k_jd) over the chunk's tokens (`select_by = "bound"`);
- `exact`: the chunk's best token logit max_j s·q·k_j, what exact attention would weigh most (no router has it);
- `bound, moved` and `exact, moved` (a rotary host that moves keys, `sink_positions` or `selected_positions`
  "window"): the same two over the chunk's keys moved right before the query's window, token j of every candidate
  at ws − c + j (ws the window's start), so every chunk is scored at one distance, the way InfLLM places its
  remote blocks (Xiao et al. 2024, §2.2): past the trained length a key at its own rotary position is read at
  a distance the weights never saw;
- `window-bound`: what `select_by = "window-bound"` ranks by, Quest's bound taken in the frame that rule keeps (each
  chunk's keys turned to −c … −1, the query turned back by ws: the same distances, but a per-channel bound is not
  rotation-invariant, so it is not `bound, moved`).

The model runs as loaded (EVA as published unless its folder selects; `--eva-select`, `--eva-ablation` as in
`evalm eval recall`: with the summaries off the ranks are still of the chunks before the window); the scores
are computed here from the queries and keys each layer is called with and the summaries in its cache, apart
from evalm/selection.py. An
item whose needle lies inside the last token's window has no rank (it is read exactly already) and is counted
as such. Output: one markdown row per (task, length, depth) and score, and OUT/ranks.json with every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from evalm.icl_eval.recall.haystacks import Haystacks
from evalm.tiling import Ablation

SCORES = ("summary", "bound", "exact")
MOVED_SCORES = ("bound, moved", "exact, moved", "window-bound")
"""Read where the model moves keys by a rotation (`EvaAttention.select_shift` or `sink_shift`)."""
TOPS = (1, 2, 4, 8)


class _Recorder:
    """Wraps every EVA layer's `attend`: keeps the keys it is called with and, when armed, the ranks."""

    def __init__(self, layers):
        self.keys: dict[int, list[torch.Tensor]] = {}
        self.ranks: list[dict | None] = []
        self.chunks: range | None = None
        """The needle's chunks: set before the last prompt token, whose query alone is ranked."""
        for layer in layers:
            layer.attend = self._wrap(layer, layer.attend)

    def _wrap(self, layer, attend):
        def recorded(q, k, v, cache=None):
            if self.chunks is not None:
                self.ranks.append(self._rank(layer, q[0, -1].detach().double(), cache))
            own = k[0].detach().clone()
            if own.shape[1] != q.shape[2]:  # a host passing its K/V heads: one per group of query heads
                own = own.repeat_interleave(q.shape[2] // own.shape[1], 1)
            self.keys.setdefault(layer.layer_idx, []).append(own)
            return attend(q, k, v, cache)
        return recorded

    def _rank(self, layer, q: torch.Tensor, cache) -> dict[str, list[int]] | None:
        """q (H, D), the last query; ranks of the needle's best chunk per K/V group, or None (no candidate)."""
        t, state = layer.layout, cache.layers[layer.layer_idx]
        keys = torch.cat(self.keys[layer.layer_idx], 0).double()  # (n, H, D): every earlier token's key
        pos = keys.shape[0]  # the last query's position
        first = t.first_chunk
        n_cand = dataclasses.replace(t, ablation=Ablation.NONE).candidate_count(pos)  # read with summaries off too
        needle = [r - first for r in self.chunks if first <= r < first + n_cand]
        if not needle:
            return None
        chunk_keys = keys[first * t.chunk : (first + n_cand) * t.chunk].unflatten(0, (n_cand, t.chunk))  # (C, c, H, D)
        summaries = torch.cat([p[0] for p in state.remote_k], -2)[:, :n_cand].double()  # (H, C, D)
        s, H = t.scale, q.shape[0]
        scores = {"summary": s * torch.einsum("hd,hcd->hc", q, summaries), "bound": s * _bound(q, chunk_keys),
                  "exact": s * torch.einsum("hd,cjhd->hcj", q, chunk_keys).amax(-1)}
        move = layer.select_shift or layer.sink_shift
        if move is not None:  # chunk M's token j moved from M·c + j to ws − c + j: one shift a chunk
            shift = t.window_start(pos) - t.chunk * (first + 1 + torch.arange(n_cand))
            moved = move(chunk_keys, shift.view(n_cand, 1, 1))
            scores["bound, moved"] = s * _bound(q, moved)
            scores["exact, moved"] = s * torch.einsum("hd,cjhd->hcj", q, moved).amax(-1)
            anchored = move(chunk_keys, -t.chunk * (first + 1 + torch.arange(n_cand)).view(n_cand, 1, 1))
            scores["window-bound"] = s * _bound(move(q, torch.tensor(-t.window_start(pos))), anchored)
        out = {}
        for name, score in scores.items():
            grouped = score.unflatten(0, (H // t.select_group, t.select_group)).sum(1)  # (groups, C)
            order = torch.argsort(-grouped, dim=-1, stable=True)  # ties to the earlier chunk, as selection takes them
            rank = torch.argsort(order, dim=-1)  # chunk -> its place
            out[name] = rank[:, needle].amin(-1).tolist()
        return out


def _bound(q: torch.Tensor, chunk_keys: torch.Tensor) -> torch.Tensor:
    """Quest's bound Σ_d max(q_d·min_j k_jd, q_d·max_j k_jd): q (H, D), chunk_keys (C, c, H, D) -> (H, C)."""
    return torch.maximum(q * chunk_keys.amin(1), q * chunk_keys.amax(1)).sum(-1).T


def _item_prompts(item: tuple[str, int, int, int], config, lm, haystacks):
    """(prompt, first needle token, needle length) per depth of `config` for item (task, length, seed, index), built
    as `evalm eval recall` builds them."""
    task, length, seed, index = item
    depths = config.depths
    from evalm.icl_eval.recall import runner as recall_runner
    from evalm.icl_eval.recall.layout import body_pieces, place
    from evalm.icl_eval.tasks.prompts import resolve_bos

    bos, _ = resolve_bos(lm.tokenizer, config.bos)
    spec, enc = recall_runner.encoded_item(task, seed, index, config, lm.tokenizer, tuple(bos))
    units, _ = haystacks.take(spec.haystack, recall_runner.item_rng(task, seed, index, "haystack"), length - enc.fixed,
                              spec.asked_words)
    pieces = body_pieces(units, enc.others, recall_runner.item_rng(task, seed, index, "place"))
    return [(place(enc, pieces, d).prompts[-1], place(enc, pieces, d).needle_at, len(enc.group[0])) for d in depths]


def needle_ranks(lm, config, segment: int = 4096, progress=print) -> list[dict]:
    """One record per (task, length, depth, seed, item): the ranks by score over layers × K/V groups."""
    from evalm.eva import eva_layers

    layers = eva_layers(lm.model)
    if not layers:
        from evalm.config_toolkit import ConfigError

        raise ConfigError(f"{lm.name}: no EVA attention layer; needle ranks read EVA's summaries (convert the model first)")
    haystacks = Haystacks(lm.tokenizer)
    c = layers[0].layout.chunk
    records = []
    for task in config.tasks:
        for length in config.lengths:
            for seed in config.seeds:
                for index in range(config.items):
                    for depth, (prompt, at, size) in zip(config.depths, _item_prompts((task, length, seed, index),
                                                                                      config, lm, haystacks)):
                        recorder = _Recorder(layers)
                        try:
                            state = lm.new_state(0)
                            with torch.no_grad():
                                for i in range(0, len(prompt) - 1, segment):
                                    lm.extend(state, torch.tensor([list(prompt[i : min(i + segment, len(prompt) - 1)])]))
                                recorder.chunks = range(at // c, (at + size - 1) // c + 1)
                                lm.extend(state, torch.tensor([list(prompt[-1:])]))
                        finally:
                            for layer in layers:
                                del layer.attend  # the class's own again
                        ranked = [r for r in recorder.ranks if r is not None]
                        names = list(ranked[0]) if ranked else SCORES
                        record = {"task": task, "length": length, "depth": depth, "seed": seed, "item": index,
                                  "tokens": len(prompt), "needle_at": at, "chunks": list(recorder.chunks),
                                  "in_window": not ranked,
                                  "ranks": {name: sum((r[name] for r in ranked), []) for name in names}}
                        records.append(record)
                        progress(f"{task} {length} depth {depth} seed {seed} item {index}: " + (
                            "needle inside the window" if not ranked else "  ".join(
                                f"{n} median {np.median(record['ranks'][n]):.0f}" for n in names)))
    return records


def table(records: list[dict]) -> str:
    """Per (task, length, depth) and score: the median rank and the share of (layer, group) readings in the top k."""
    from evalm.config_toolkit.markdown import markdown

    rows, seen = [], []
    for r in records:
        key = (r["task"], r["length"], r["depth"])
        if key not in seen:
            seen.append(key)
    for task, length, depth in seen:
        cell = [r for r in records if (r["task"], r["length"], r["depth"]) == (task, length, depth)]
        ranked = [r for r in cell if not r["in_window"]]
        for name in SCORES + tuple(n for n in MOVED_SCORES if any(n in r["ranks"] for r in cell)):
            ranks = np.array(sum((r["ranks"][name] for r in ranked), []))
            if not ranks.size:
                rows.append([task, f"{length:,}", str(depth), name, "-", *["-"] * len(TOPS), f"{len(cell)} in the window"])
                continue
            rows.append([task, f"{length:,}", str(depth), name, f"{np.median(ranks):.0f}",
                         *[f"{(ranks < k).mean():.2f}" for k in TOPS], f"{len(ranked)} items, {ranks.size} readings"])
    return markdown(["family", "length", "depth", "score", "median rank", *[f"top {k}" for k in TOPS], "over"], rows)


def _ints(flag: str, text: str) -> tuple[int, ...]:
    from evalm.config_toolkit import ConfigError

    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} {text}: give whole numbers separated by commas, e.g. {flag} 8192,16384") from None


def main(argv: Sequence[str] | None = None) -> int:
    from evalm.config_toolkit import Parser, build
    from evalm.icl_eval.cli_args import load_flags
    from evalm.icl_eval.models.loading import load_lm
    from evalm.icl_eval.models.source import LoadOptions, ModelSource
    from evalm.icl_eval.recall.command import check_items
    from evalm.icl_eval.recall.config import RecallConfig
    from evalm.icl_eval.report import write_json

    p = Parser(prog="evalm eval needle-ranks", description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-model", required=True, metavar="DIR", help="a Hugging Face folder with EVA attention, e.g. "
                   "one `evalm convert` wrote (required)")
    p.add_argument("--tasks", default="passkey", metavar="T1,T2",
                   help="recall families with one needle group: passkey, niah_single, ... (default: passkey)")
    p.add_argument("--lengths", default="8192", metavar="L1,L2", help="prompt lengths in tokens (default: 8192)")
    p.add_argument("--depths", default="0,50", metavar="D1,D2", help="needle depths, percent (default: 0,50)")
    p.add_argument("--seeds", default="1", metavar="S1,S2", help="item seeds, as `evalm eval recall` (default: 1)")
    p.add_argument("--items", type=int, default=1, metavar="N", help="items per seed, task and length (default: 1)")
    p.add_argument("--out", default="runs/needle-ranks", metavar="DIR",
                   help="folder for ranks.json (default: runs/needle-ranks)")
    load_flags(p, LoadOptions, ("eva_select", "eva_ablation"))  # as `evalm eval recall`'s; no-remote: ranks all the same
    args = p.parse_args(argv)
    config = build(RecallConfig, {"tasks": tuple(args.tasks.split(",")), "lengths": _ints("--lengths", args.lengths),
                                  "depths": _ints("--depths", args.depths), "seeds": _ints("--seeds", args.seeds),
                                  "items": args.items}, where="flags")
    options = build(LoadOptions, {k: getattr(args, k) for k in ("eva_select", "eva_ablation") if getattr(args, k) is not None},
                    where="flags")
    lm = load_lm(ModelSource.of(None, args.hf_model, None, None), options, "cpu")
    check_items(config, lm.tokenizer, None)  # a length too short for an item's needles and question: one line
    records = needle_ranks(lm, config)
    out = Path(args.out)
    write_json(out / "ranks.json", {"model": args.hf_model, "argv": list(argv or []), "records": records})
    print(table(records))
    print(f"wrote {out / 'ranks.json'}")
    return 0
