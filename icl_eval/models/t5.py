"""Encoder-decoder backend: Hugging Face T5 with SAICL's structured encoder (SAICL §3.2, Appendix B).

A `T5LM` wraps a `T5ForConditionalGeneration`, loaded from a local folder (`load_t5`, never the
network) or built here tiny and random (`tiny_t5`). Its encoder runs one of three ways, and the
decoder scores the candidates against whatever the encoder produced:

| encoder    | what attends to what                                                    | cost      |
|------------|-------------------------------------------------------------------------|-----------|
| `full`     | the stock encoder over d_1 ... d_k test (the T5 baseline)               | O(k²L²)   |
| `saicl`    | demo tokens: own demo + test; test tokens: everything (App. B blocks)   | O(kL²)    |
| `fid`      | the stock encoder over each (d_i, test) pair alone, outputs concatenated | O(kL²)    |

[position note] T5 has no absolute positions: layer 0's relative-position buckets are the only
order signal. SAICL keeps them "only inside each demonstration or the test" (§3.2), so inside a
segment the bias is the stock one over local positions, and the blocks between a demonstration and
the test carry no bias (Appendix B adds only the mask there): `cross="none"`, the paper's. The
option `cross="aligned"` instead places every demonstration right before the test (token j of a
demonstration of length n sits at j - n, the test at 0, 1, ...) and gives those blocks the stock
bias of that distance; it is still permutation invariant, and with one demonstration it is exactly
the full-attention encoder (the `saicl == concat` oracle).

The structured forward reuses the stock blocks' weights (layer norms, q/k/v/o, feed-forward); only
the attention product is blocked, so the memory of the scores is k·Ld·(Ld+Lt) + Lt·(k·Ld+Lt).
The oracle (tests/icl_eval/test_t5.py) runs the *unmodified* `T5Block`s over the flat sequence with
an explicit additive mask and a position bias assembled from the stock `compute_bias` per segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from evalm.config_toolkit import ConfigError, MissingInput, transformers_module

Cross = Literal["none", "aligned"]


@dataclass(frozen=True)
class T5Shape:
    """The shape of a tiny T5 (`tiny_t5_config`): vocabulary (bytes + end by default), end id, width, layers
    of the encoder and of the decoder each, heads, feed-forward width, dropout."""

    vocab_size: int = 257
    eos_id: int = 256
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    d_ff: int = 128
    dropout: float = 0.0


def tiny_t5_config(shape: T5Shape = T5Shape()):
    """A T5.1.1 / LM-adapt shaped config (gated-GELU, untied head) small enough for a CPU; id 0 is pad/start."""
    tf = transformers_module()
    return tf.T5Config(vocab_size=shape.vocab_size, d_model=shape.d_model, d_kv=shape.d_model // shape.heads,
                       d_ff=shape.d_ff, num_layers=shape.layers, num_decoder_layers=shape.layers, num_heads=shape.heads,
                       relative_attention_num_buckets=32, relative_attention_max_distance=128,
                       dropout_rate=shape.dropout, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                       pad_token_id=0, eos_token_id=shape.eos_id, decoder_start_token_id=0, attn_implementation="eager")


def tiny_t5(seed: int = 0, dtype=torch.float32, init_std: float | None = None, shape: T5Shape = T5Shape()) -> T5LM:
    """A randomly initialised tiny T5 with byte tokens (no download). `init_std` widens the weights so
    that attention patterns, and so any masking bug, show in the scores of an untrained model."""
    from evalm.text.tokenizer import ByteTokenizer

    tf = transformers_module()
    torch.manual_seed(seed)
    model = tf.T5ForConditionalGeneration(tiny_t5_config(shape))
    if init_std:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0, init_std)
    return T5LM(model.to(dtype), ByteTokenizer(), name="tiny random T5")


def load_t5(folder, tokenizer=None, dtype: str = "float32", device: str = "cpu") -> T5LM:
    """A T5ForConditionalGeneration (and its tokenizer unless given) from a local folder (a path, or the
    `evalm.hf_folder.CheckedFolder` of this load, not checked again); never the network."""
    from evalm.icl_eval.models.hf import HFTokenizerAdapter

    from evalm import hf_folder

    tf = transformers_module()
    if not isinstance(folder, hf_folder.CheckedFolder) and not Path(folder).is_dir():
        raise MissingInput(f"{folder}: T5 model folder not found")
    checked = hf_folder.gate(folder)
    model = hf_folder.model(tf.T5ForConditionalGeneration, checked, dtype=getattr(torch, dtype), device=device,
                            attn_implementation="eager").to(device)  # no code from the folder, weights checked first
    if tokenizer is None:
        tokenizer = HFTokenizerAdapter(hf_folder.tokenizer(checked))
    return T5LM(model, tokenizer, name=str(checked.path))


class T5LM:
    """An encoder-decoder model the methods of `icl_eval.methods.encoder_decoder` drive."""

    encoder_decoder = True
    max_positions = None  # relative positions only: no window (SAICL §3.1 "extensibility")

    def __init__(self, model, tokenizer, name: str = "t5"):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        cfg = model.config
        self.pad_id = int(cfg.pad_token_id)
        self.start_id = int(cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else cfg.pad_token_id)
        self.eos_id = int(tokenizer.eos_id)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    def describe(self) -> dict[str, Any]:
        return {"kind": "t5", "name": self.name, "model_type": self.model.config.model_type,
                "n_params": sum(p.numel() for p in self.model.parameters())}

    def save(self, folder: str | Path) -> None:
        self.model.save_pretrained(folder)

    def encode(self, kind: str, demos: list[list[tuple[int, ...]]], tests: list[tuple[int, ...]],
               cross: Cross = "none") -> tuple[Tensor, Tensor]:
        """Encoder states and key mask (B, N, d), (B, N) for a batch of (demonstrations, test) prompts."""
        return encode(self.model, kind, demos, tests, self.pad_id, cross)

    def decoder_logits(self, hidden: Tensor, mask: Tensor, decoder_tokens: Tensor) -> Tensor:
        """(B, T, V) logits (float32, or float64 for a float64 model) of the decoder fed `decoder_tokens` (B, T)."""
        out = self.model(encoder_outputs=(hidden,), attention_mask=mask.long(),
                         decoder_input_ids=decoder_tokens.to(self.device), use_cache=False)
        return out.logits.to(torch.promote_types(out.logits.dtype, torch.float32))


# ----------------------------------------------------------------------------------------------
# batching: token tuples -> padded tensors

def pad_rows(rows: list[tuple[int, ...]], pad_id: int, width: int | None = None) -> tuple[Tensor, Tensor]:
    """(B, W) right-padded ids and their bool mask."""
    width = max(width or 0, max((len(r) for r in rows), default=0), 1)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    return ids, mask


@dataclass
class Segments:
    """SAICL's input: k demonstrations (each right-padded to Ld) and the test (right-padded to Lt)."""

    demos: Tensor  # (B, k, Ld) long
    demo_mask: Tensor  # (B, k, Ld) bool
    test: Tensor  # (B, Lt) long
    test_mask: Tensor  # (B, Lt) bool

    @classmethod
    def build(cls, demos: list[list[tuple[int, ...]]], tests: list[tuple[int, ...]], pad_id: int) -> Segments:
        k = len(demos[0])
        if any(len(d) != k for d in demos):
            raise ValueError("every prompt of a SAICL batch needs the same number of demonstrations")
        width = max(len(s) for d in demos for s in d)
        ids, mask = pad_rows([s for d in demos for s in d], pad_id, width)
        test, test_mask = pad_rows(tests, pad_id)
        return cls(ids.view(len(demos), k, -1), mask.view(len(demos), k, -1), test, test_mask)

    def positions(self, cross: Cross) -> tuple[Tensor, Tensor]:
        """Positions of demo tokens (B, k, Ld) and test tokens (Lt,): local, or right-aligned to the test."""
        Ld, Lt = self.demos.shape[-1], self.test.shape[-1]
        local = torch.arange(Ld).expand_as(self.demos)
        if cross == "aligned":
            local = local - self.demo_mask.sum(-1, keepdim=True)  # token j of a length-n demo at j - n
        return local, torch.arange(Lt)


def encode(model, kind: str, demos: list[list[tuple[int, ...]]], tests: list[tuple[int, ...]], pad_id: int,
           cross: Cross = "none") -> tuple[Tensor, Tensor]:
    """Encoder states and key mask for `full` (concatenation), `saicl` or `fid` over a batch of prompts."""
    device = next(model.parameters()).device
    if kind == "full":
        ids, mask = pad_rows([tuple(t for s in d for t in s) + tuple(x) for d, x in zip(demos, tests)], pad_id)
        ids, mask = ids.to(device), mask.to(device)
        return model.encoder(input_ids=ids, attention_mask=mask.long()).last_hidden_state, mask
    if kind == "fid":
        pairs = [tuple(s) + tuple(x) for d, x in zip(demos, tests) for s in (d or [()])]
        ids, mask = pad_rows(pairs, pad_id)
        ids, mask = ids.to(device), mask.to(device)
        hidden = model.encoder(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        B = len(tests)
        return hidden.reshape(B, -1, hidden.shape[-1]), mask.reshape(B, -1)
    if kind == "saicl":
        return structured_encode(model, Segments.build(demos, tests, pad_id), cross)
    raise ConfigError(f"encoder kind {kind!r} is not known; valid: full, saicl, fid")


# ----------------------------------------------------------------------------------------------
# SAICL's structured encoder (Appendix B), on the stock blocks' weights

def relative_bias(attn, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """T5's bucketed relative-position bias (H, ..., Q, K) for query/key positions (..., Q), (..., K)."""
    rel = k_pos.unsqueeze(-2) - q_pos.unsqueeze(-1)  # memory - query, as `T5Attention.compute_bias`
    buckets = attn._relative_position_bucket(rel, bidirectional=not attn.is_decoder,
                                             num_buckets=attn.relative_attention_num_buckets,
                                             max_distance=attn.relative_attention_max_distance)
    return attn.relative_attention_bias(buckets).movedim(-1, 0)


def _additive(visible: Tensor, dtype) -> Tensor:
    """0 where visible, the dtype's minimum elsewhere (HF's additive-mask convention)."""
    zero = torch.zeros((), dtype=dtype, device=visible.device)
    return torch.where(visible, zero, torch.finfo(dtype).min)


def _block_biases(attn, seg: Segments, cross: Cross, dtype) -> dict[str, Tensor]:
    """Additive position bias + key mask of the four blocks (shared by every layer, as in T5)."""
    device = attn.relative_attention_bias.weight.device
    dpos, tpos = (p.to(device) for p in seg.positions(cross))
    dkey = _additive(seg.demo_mask.to(device), dtype)  # (B, k, Ld)
    tkey = _additive(seg.test_mask.to(device), dtype)  # (B, Lt)
    local = torch.arange(seg.demos.shape[-1], device=device)
    dd = relative_bias(attn, local, local).to(dtype)[None, :, None] + dkey[:, None, :, None, :]  # (B,H,k,Ld,Ld)
    tt = relative_bias(attn, tpos, tpos).to(dtype)[None] + tkey[:, None, None, :]  # (B,H,Lt,Lt)
    dt = tkey[:, None, None, None, :]  # (B,1,1,1,Lt)
    td = dkey[:, None, None]  # (B,1,1,k,Ld)
    if cross == "aligned":
        tq = tpos.expand(*dpos.shape[:2], -1)  # (B, k, Lt)
        dt = dt + relative_bias(attn, dpos, tq).to(dtype).movedim(0, 1)  # (B, H, k, Ld, Lt)
        td = td + relative_bias(attn, tq, dpos).to(dtype).permute(1, 0, 3, 2, 4)  # (B, H, Lt, k, Ld)
    return {"dd": dd, "dt": dt, "td": td, "tt": tt}


def structured_attention(attn, xd: Tensor, xt: Tensor, bias: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Appendix B: demo queries see their own demo + the test; test queries see everything. One softmax per row."""
    B, k, Ld, _ = xd.shape
    Lt, H, D = xt.shape[1], attn.n_heads, attn.key_value_proj_dim
    qd, kd, vd = (f(xd).view(B, k, Ld, H, D).permute(0, 3, 1, 2, 4) for f in (attn.q, attn.k, attn.v))  # b h s t d
    qt, kt, vt = (f(xt).view(B, Lt, H, D).transpose(1, 2) for f in (attn.q, attn.k, attn.v))  # b h t d
    s_dd = torch.einsum("bhstd,bhsrd->bhstr", qd, kd) * attn.scaling + bias["dd"]
    s_dt = torch.einsum("bhstd,bhrd->bhstr", qd, kt) * attn.scaling + bias["dt"]
    p_d = torch.softmax(torch.cat([s_dd, s_dt], -1), dim=-1)
    p_d = F.dropout(p_d, p=attn.dropout, training=attn.training)
    out_d = torch.einsum("bhstr,bhsrd->bhstd", p_d[..., :Ld], vd) + torch.einsum("bhstr,bhrd->bhstd", p_d[..., Ld:], vt)
    s_td = torch.einsum("bhtd,bhsrd->bhtsr", qt, kd) * attn.scaling + bias["td"]
    s_tt = torch.einsum("bhtd,bhrd->bhtr", qt, kt) * attn.scaling + bias["tt"]
    p_t = torch.softmax(torch.cat([s_td.reshape(B, H, Lt, k * Ld), s_tt], -1), dim=-1)
    p_t = F.dropout(p_t, p=attn.dropout, training=attn.training)
    out_t = p_t[..., : k * Ld] @ vd.reshape(B, H, k * Ld, D) + p_t[..., k * Ld:] @ vt
    out_d = attn.o(out_d.permute(0, 2, 3, 1, 4).reshape(B, k, Ld, H * D))
    out_t = attn.o(out_t.transpose(1, 2).reshape(B, Lt, H * D))
    return out_d, out_t


def structured_encode(model, seg: Segments, cross: Cross = "none") -> tuple[Tensor, Tensor]:
    """The T5 encoder with SAICL attention: states (B, k·Ld + Lt, d) in [demos..., test] order, and the key mask."""
    enc = model.encoder
    device = enc.embed_tokens.weight.device
    hd = enc.dropout(enc.embed_tokens(seg.demos.to(device)))
    ht = enc.dropout(enc.embed_tokens(seg.test.to(device)))
    bias = _block_biases(enc.block[0].layer[0].SelfAttention, seg, cross, hd.dtype)
    for block in enc.block:
        sa, ff = block.layer[0], block.layer[-1]
        ad, at = structured_attention(sa.SelfAttention, sa.layer_norm(hd), sa.layer_norm(ht), bias)
        hd, ht = ff(hd + sa.dropout(ad)), ff(ht + sa.dropout(at))
    hd, ht = enc.dropout(enc.final_layer_norm(hd)), enc.dropout(enc.final_layer_norm(ht))
    B = hd.shape[0]
    hidden = torch.cat([hd.reshape(B, -1, hd.shape[-1]), ht], 1)
    mask = torch.cat([seg.demo_mask.reshape(B, -1), seg.test_mask], 1).to(device)
    return hidden, mask

