"""The recall study's state-space twin: `transformers.MambaForCausalLM` run by a selective scan that
carries its state from one segment to the next (`evalm train recall --arch mamba`).

The model is `transformers.MambaForCausalLM` (its parameters, initialisation, RMSNorms, causal
convolution and projections; Gu & Dao 2023, Algorithm 2). Two things of its PyTorch path do not
serve the study on a CPU, so its forward is driven here, block by block, through
`MambaTwin.forward(tokens, state)`:

- speed: the reference scan (`mamba_selective_scan` without `mamba-ssm`) discretises the whole
  sequence first, (B, d_inner, T, N) tensors, and its backward materialises that tensor once per time
  step (the gradient of each slice); the scan below discretises one step at a time (the timings:
  `python benchmarks/recall_ssm.py`, docs/findings.md);
- segments: its full-sequence path starts every call from a zero state (the kernel's "initial
  state is not supported"), so a 262,144-token sequence would be one call holding
  (d_inner, 262144, N) floats per block. Here each segment starts from the previous one's state.

Needs `transformers` (`pip install 'evalm[hf]'`), imported when a twin is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from evalm.config_toolkit import MissingExtra


@dataclass(frozen=True)
class BlockState:
    """One block's recurrent state: the last (K - 1) convolution inputs and the SSM state."""

    conv: Tensor  # (B, d_inner, K - 1)
    ssm: Tensor  # (B, d_inner, N)


def _transformers():
    """transformers, or one line naming the extra (the twin is its Mamba)."""
    try:
        import transformers
    except ImportError as err:
        raise MissingExtra("the Mamba twin is transformers' MambaForCausalLM: pip install 'evalm[hf]'") from err
    return transformers


def mamba_config(vocab_size: int, width: int, n_block: int):
    """`transformers.MambaConfig` of the twin: state 16, expansion 2, convolution 4 (the paper's)."""
    return _transformers().MambaConfig(vocab_size=vocab_size, hidden_size=width, num_hidden_layers=n_block,
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
        self.hf = _transformers().MambaForCausalLM(mamba_config(vocab_size, width, n_block))

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
