"""The recall study's Mamba twin (evalm/mamba_twin.py) checked and timed: against `transformers`'
`MambaForCausalLM` forward, and beside its own reference scan and the main job's EVA model.

The twin is `transformers.MambaForCausalLM` driven block by block through
`MambaTwin.forward(tokens, state)`, because two things of its PyTorch path do not serve the study
on a CPU:

- speed: the reference scan (`mamba_selective_scan` without `mamba-ssm`) discretises the whole
  sequence first, (B, d_inner, T, N) tensors, and its backward materialises that tensor once per time
  step (the gradient of each slice): measured on this 2-core AMD EPYC at width 64, 4 blocks,
  batch 32 x 256 tokens, forward 5.2 s and one backward over 5 minutes; with `use_mambapy` (the
  `mambapy` parallel scan) 0.9 s + 77 s (idle, 26 Nov). The twin's scan discretises one step at a time:
  1.0 s + 1.7 s (`python benchmarks/recall_ssm.py`, same run);
- segments: its full-sequence path starts every call from a zero state (the kernel's "initial
  state is not supported"), so a 262,144-token sequence would be one call holding
  (d_inner, 262144, N) floats per block. Here each segment starts from the previous one's state.

Timed here, same run: the twin's forward and backward against `transformers` with `mambapy`, then the twin at
the main job's tiny shape beside its EVA model (why the twin is not in `evalm run`: docs/findings.md). That
the twin's logits are `MambaForCausalLM`'s, whole and in segments, is tests/icl_eval/test_recall_study.py's.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import timing
from evalm.mamba_twin import MambaTwin


def main(batch: int = 32, tokens: int = 256) -> None:
    print(timing.machine())
    torch.manual_seed(0)
    torch.set_num_threads(1)
    twin = MambaTwin(512, 64, 4).train()
    x = torch.randint(0, 512, (batch, tokens))
    for name, run in (("twin", lambda: twin(x)[0]), ("transformers + mambapy", lambda: _mambapy(twin)(input_ids=x).logits)):
        t0 = time.perf_counter()
        logits = run()
        t1 = time.perf_counter()
        logits.float().logsumexp(-1).mean().backward()
        print(f"{name}: forward {t1 - t0:.2f} s, backward {time.perf_counter() - t1:.2f} s (batch {batch} x {tokens}, width 64)")
    _main_job_cost()


def _main_job_cost() -> None:
    """What the twin would cost in `evalm run`, per training token: a step of 8 lines of 1,024 tokens (the
    main job trains on 1,024-token lines, then 512), the twin at the tiny shape (width 64, 4 blocks for 2
    attention blocks, vocabulary 1,024) beside the EVA model of configs/model-tiny.toml, one thread each,
    in this process."""
    from evalm.config import ModelConfig
    from evalm.config_toolkit.files import read_toml
    from evalm.model import EvalmModel

    shape = read_toml("configs/model-tiny.toml")["model"]
    x = torch.randint(0, shape["vocab_size"], (8, 1024))
    models = {"EVA (configs/model-tiny.toml)": lambda: EvalmModel(ModelConfig(**shape)),
              "Mamba twin": lambda: MambaTwin(shape["vocab_size"], shape["d_model"], 2 * shape["n_layer"])}
    seconds = {}
    for name, make in models.items():
        torch.manual_seed(0)
        model = make().train()
        for _ in range(2):  # the first step warms allocator and kernels
            t0 = time.perf_counter()
            out = model(x[:, :-1])
            logits = out[0] if isinstance(out, tuple) else out
            F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten()).backward()
            seconds[name] = time.perf_counter() - t0
        print(f"{name}: {seconds[name]:.2f} s per step of 8 x 1,024 tokens ({8 * 1023 / seconds[name]:,.0f} tokens/s)")
    eva, twin = seconds.values()
    print(f"Mamba twin / EVA per training token: {timing.ratio(twin, eva)}")


def _mambapy(twin: MambaTwin):
    twin.hf.config.use_mambapy = True
    for block in twin.hf.backbone.layers:
        block.mixer.use_mambapy = True
    return twin.hf


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__))
