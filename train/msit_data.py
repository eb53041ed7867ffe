"""`evalm train msit-data`: many-shot tuning rows from the synthetic family and an instruction file.

    evalm train msit-data --out runs/tiny/msit/data/train.jsonl
    evalm train msit-data --out tune.jsonl --episodes 1000 --inputs 2,4,8 \
        --instructions data/samples/instructions/train.jsonl --instructions-limit 400

Writes `{"task", "input", "output"}` rows, the columns `evalm train msit` reads by default
(`data.train_file`): first `--episodes` synthetic episodes of `--examples` rows, each a fresh rule
named `synthetic-NNNNN` (`evalm.text.synthetic.instruction_examples`, seeded by `--seed`, far from the
small seeds of the evaluation episodes), then rows of an instruction jsonl file as they are.
MSIT packs a task's examples into one line (EVALM §3.2), so each synthetic episode becomes a
many-shot line whose answer-only loss is the in-context objective. `--inputs` cycles the episodes
through rule sizes: small rules let the recall circuit form early (docs/evaluation.md, "The
synthetic family"). `evalm run` runs this command as the first half of its msit stage.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evalm.config_toolkit import ConfigError, InputError, MissingInput, Parser, report
from evalm.storage import overlap, write_atomic

DEFAULTS = {"episodes": 1200, "examples": 160, "inputs": (2, 4, 8, 16), "seed": 10**6}
"""The embedded run's tuning data (configs/tiny.toml [msit])."""


def _rule_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"--inputs {text!r}: give comma-separated integers, e.g. 2,4,8,16") from None
    if not sizes or any(not 2 <= n <= 26 for n in sizes):
        raise ConfigError(f"--inputs {text!r}: every rule size must lie in 2..26 (one letter per input)")
    return sizes


def _parser() -> Parser:
    p = Parser(prog="evalm train msit-data", description=__doc__)
    p.add_argument("--out", required=True, metavar="FILE", help="the jsonl file to write (required)")
    p.add_argument("--episodes", type=int, default=DEFAULTS["episodes"], metavar="N",
                   help=f"synthetic episodes, one fresh rule each (default: {DEFAULTS['episodes']}; 0: none)")
    p.add_argument("--examples", type=int, default=DEFAULTS["examples"], metavar="N",
                   help=f"rows per synthetic episode, about one packed line each (default: {DEFAULTS['examples']})")
    p.add_argument("--inputs", default=",".join(map(str, DEFAULTS["inputs"])), metavar="N,N,...",
                   help="rule sizes (inputs per episode) the episodes cycle through, each in 2..26 "
                        f"(default: {','.join(map(str, DEFAULTS['inputs']))})")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], metavar="S",
                   help=f"seed of the synthetic rules and rows (default: {DEFAULTS['seed']})")
    p.add_argument("--instructions", default=None, metavar="PATH",
                   help="instruction rows (jsonl of task/input/output) appended after the episodes (default: none)")
    p.add_argument("--instructions-limit", type=int, default=0, metavar="N",
                   help="rows taken from the top of --instructions (default: 0, every row)")
    return p


def read_instructions(path: Path, limit: int) -> list[dict]:
    """The first `limit` rows (all with 0) of a jsonl file; a bad line is an error naming it."""
    if not path.is_file():
        raise MissingInput(f"--instructions {path}: no such file; give a jsonl file of task/input/output rows")
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if limit and len(rows) >= limit:
                break
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise InputError(f"--instructions {path}:{number}: not a JSON row ({err.msg}); "
                                 "each line must be one JSON object") from None
    return rows


@dataclass(frozen=True)
class MsitRows:
    """What `evalm train msit-data` writes: synthetic episodes of `examples` examples each, their rules' input
    counts, the seed, and an instruction jsonl with how many of its rows to take (0: all)."""

    episodes: int
    examples: int
    inputs: Sequence[int]
    seed: int
    instructions: Path | None = None
    instructions_limit: int = 0


def write_msit_data(out: Path, what: MsitRows) -> dict[str, int]:
    """Write the rows; returns how many came from each source."""
    from evalm.text.synthetic import SyntheticConfig, instruction_examples

    if what.episodes < 0 or what.examples < 1 or what.instructions_limit < 0:
        raise ConfigError("--episodes and --instructions-limit must be >= 0 and --examples >= 1")
    if not what.episodes and what.instructions is None:
        raise ConfigError("--episodes 0 and no --instructions: nothing to write; give either")
    instructions = what.instructions
    if instructions is not None and (overlap(out, instructions) or out.exists() and instructions.exists()
                                     and out.samefile(instructions)):  # a hard link is the same file too
        raise ConfigError(f"--out {out} is, or overlaps, the input --instructions {instructions}; writing it would "
                          "destroy what it reads: choose another --out")
    rows = instruction_examples(SyntheticConfig(), what.episodes, what.examples, seed=what.seed,
                                inputs_per_episode=what.inputs)
    n_synthetic = len(rows)
    if what.instructions is not None:
        rows += read_instructions(what.instructions, what.instructions_limit)
    write_atomic(out, "".join(json.dumps(row) + "\n" for row in rows))  # whole, never through a link
    return {"synthetic": n_synthetic, "instructions": len(rows) - n_synthetic}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        counts = write_msit_data(Path(args.out), MsitRows(args.episodes, args.examples, _rule_sizes(args.inputs),
                                                          args.seed, Path(args.instructions) if args.instructions else None,
                                                          args.instructions_limit))
    except Exception as err:  # noqa: BLE001 - the one rule: a user error in one line, else a bug with its log
        return report("evalm train msit-data", err)
    print(f"wrote {args.out}: {counts['synthetic']} synthetic rows ({args.episodes} episodes), "
          f"{counts['instructions']} instruction rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
