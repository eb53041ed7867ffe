"""The state-space twin of the recall study (benchmarks/recall.py): Mamba from `transformers`, run by
a selective scan that carries its state from one segment to the next.

The model is `transformers.MambaForCausalLM` (its parameters, initialisation, RMSNorms, causal
convolution and projections; Gu & Dao 2023, Algorithm 2). Two things of its PyTorch path do not
serve this study on a CPU, so its forward is driven here, block by block, through
`MambaTwin.forward(tokens, state)`:

- speed: the reference scan (`mamba_selective_scan` without `mamba-ssm`) discretises the whole
  sequence first, (B, d_inner, T, N) tensors, and its backward materialises that tensor once per time
  step (the gradient of each slice): measured on this 2-core AMD EPYC at width 64, 4 blocks,
  batch 32 x 256 tokens, forward 5.2 s and one backward over 5 minutes; with `use_mambapy` (the
  `mambapy` parallel scan) 0.9 s + 77 s (idle, 26 Nov). The scan below discretises one step at a time:
  1.0 s + 1.7 s (`python benchmarks/recall_ssm.py`, same run);
- segments: its full-sequence path starts every call from a zero state (the kernel's "initial
  state is not supported"), so a 262,144-token sequence would be one call holding
  (d_inner, 262144, N) floats per block. Here each segment starts from the previous one's state.

`tests/benchmarks`-free check: `python benchmarks/recall_ssm.py` compares the logits with
`MambaForCausalLM`'s own forward on the same tokens, whole and in segments (max difference printed,
must be < 1e-4), then times both, and then the twin at the main job's tiny shape beside its EVA model
(why the twin is not in `evalm run`: docs/findings.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class BlockState:
    """One block's recurrent state: the last (K - 1) convolution inputs and the SSM state."""

    conv: Tensor  # (B, d_inner, K - 1)
    ssm: Tensor  # (B, d_inner, N)


def mamba_config(vocab_size: int, width: int, n_block: int):
    """`transformers.MambaConfig` of the twin: state 16, expansion 2, convolution 4 (the paper's)."""
    import transformers

    return transformers.MambaConfig(vocab_size=vocab_size, hidden_size=width, num_hidden_layers=n_block,
                                    state_size=16, expand=2, conv_kernel=4, tie_word_embeddings=True)


def mixer(m, x: Tensor, state: BlockState | None) -> tuple[Tensor, BlockState]:
    """`MambaMixer` on x (B, T, E) continuing from `state`: y (B, T, E) and the state after x."""
    B, T, _ = x.shape
    d_in, K = m.intermediate_size, m.conv_kernel_size
    u, gate = m.in_proj(x).transpose(1, 2).chunk(2, dim=1)  # (B, d_inner, T) each
    prev = state.conv if state is not None else u.new_zeros(B, d_in, K - 1)
    u_all = torch.cat([prev, u], -1)
    u = m.act(F.conv1d(u_all, m.conv1d.weight, m.conv1d.bias, groups=d_in))  # causal: T outputs
    dt, b, c = torch.split(m.x_proj(u.transpose(1, 2)), [m.time_step_rank, m.ssm_state_size, m.ssm_state_size], -1)
    dt = F.softplus(m.dt_proj(dt))  # (B, T, d_inner): Δ, with its bias
    a = -torch.exp(m.A_log.float())  # (d_inner, N)
    h = state.ssm if state is not None else u.new_zeros(B, d_in, m.ssm_state_size)
    # h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t u_t ;  y_t = C_t h_t. The discretised terms are built for the
    # segment at once and unbound along time (their gradient is one stack, not a full tensor per step).
    decay = torch.exp(dt[..., None] * a).unbind(1)  # T x (B, d_inner, N)
    drive = ((dt * u.transpose(1, 2))[..., None] * b[:, :, None, :]).unbind(1)
    states = []
    for t in range(T):
        h = torch.addcmul(drive[t], decay[t], h)  # one kernel a step: a GPU's scan is launch-bound
        states.append(h)
    ys = [torch.einsum("btdn,btn->bdt", torch.stack(states, 1), c)]
    y = torch.cat(ys, -1) + u * m.D[None, :, None]
    y = y * F.silu(gate)
    return m.out_proj(y.transpose(1, 2)), BlockState(u_all[..., -(K - 1):], h)


class MambaTwin(nn.Module):
    """`MambaForCausalLM` with a forward that takes and returns the per-block recurrent states."""

    def __init__(self, vocab_size: int, width: int, n_block: int):
        super().__init__()
        import transformers

        self.hf = transformers.MambaForCausalLM(mamba_config(vocab_size, width, n_block))

    def forward(self, tokens: Tensor, state: list[BlockState] | None = None) -> tuple[Tensor, list[BlockState]]:
        """tokens (B, T) -> (logits (B, T, V), the states after them); `state` None starts from zeros."""
        backbone = self.hf.backbone
        x = backbone.embeddings(tokens)
        new = []
        for i, block in enumerate(backbone.layers):
            y, s = mixer(block.mixer, block.norm(x), state[i] if state is not None else None)
            x = x + y
            new.append(s)
        return self.hf.lm_head(backbone.norm_f(x)), new


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    twin = MambaTwin(512, 64, 4).eval()
    tokens = torch.randint(0, 512, (2, 96))
    with torch.no_grad():
        ref = twin.hf(input_ids=tokens).logits
        whole, _ = twin(tokens)
        state, parts = None, []
        for lo, hi in ((0, 1), (1, 40), (40, 41), (41, 96)):
            out, state = twin(tokens[:, lo:hi], state)
            parts.append(out)
    print(f"max |twin - MambaForCausalLM|: whole {(whole - ref).abs().max():.2e}, "
          f"in 4 segments {(torch.cat(parts, 1) - ref).abs().max():.2e}")
    twin.train()
    x = torch.randint(0, 512, (32, 256))
    for name, run in (("twin", lambda: twin(x)[0]), ("transformers + mambapy", lambda: _mambapy(twin)(input_ids=x).logits)):
        t0 = time.perf_counter()
        logits = run()
        t1 = time.perf_counter()
        logits.float().logsumexp(-1).mean().backward()
        print(f"{name}: forward {t1 - t0:.2f} s, backward {time.perf_counter() - t1:.2f} s (batch 32 x 256, width 64)")
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
    print(f"Mamba twin / EVA per training token: {twin / eva:.1f}x")


def _mambapy(twin: MambaTwin):
    twin.hf.config.use_mambapy = True
    for block in twin.hf.backbone.layers:
        block.mixer.use_mambapy = True
    return twin.hf


if __name__ == "__main__":
    main()
