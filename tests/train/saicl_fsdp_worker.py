"""One rank of test_structure's FSDP check: gradients of the SAICL-mask loss through the trainer's
FSDP2 model (train.parallelize.apply_fsdp) equal those of an unsharded copy on the whole batch."""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from tests.train.test_structure import EOS, _lines, _model
from evalm.train.data import IGNORE
from evalm.train.parallelize import apply_fsdp
from evalm.train.structure import SaiclMask

EPS32 = torch.finfo(torch.float32).eps


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    plain = _model().float().eval()  # eval: EVA draws no random features, so both sides compute the same
    sharded = copy.deepcopy(plain)
    apply_fsdp(sharded, init_device_mesh("cpu", (world,)), bf16=False, shard_blocks=sys.argv[1] == "blocks")
    structure = SaiclMask(EOS, queries=3)
    inputs, targets = _lines(2 * world, 7, 6, seq_len=50)

    def loss(model, rows):
        (demos, tests), test_targets = structure.prepare(inputs[rows], targets[rows])
        logits = structure.logits(model, (demos, tests), "cpu")
        return F.cross_entropy(logits.flatten(0, 1), test_targets.flatten(), ignore_index=IGNORE, reduction="sum")

    loss(plain, slice(None)).backward()
    loss(sharded, slice(2 * rank, 2 * rank + 2)).backward()
    # Each parameter's difference in float32 ulps of its largest gradient entry (a scale every CPU's
    # rounding follows), not in absolute units, which would hold only for this model's gradient sizes.
    worst = max(float((q.grad.full_tensor() * world - p.grad).abs().max() / (p.grad.abs().max() * EPS32))
                for p, q in zip(plain.parameters(), sharded.parameters()))
    if rank == 0:
        print(f"max gradient difference {worst:.3f} ulps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
