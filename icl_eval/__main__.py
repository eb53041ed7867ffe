"""`python -m evalm.icl_eval icl|ppl|harness|recall ARGS`: the `evalm eval` commands, launchable by torchrun.

    torchrun --nproc_per_node=8 -m evalm.icl_eval icl --checkpoint DIR --task sst2 --out runs/icl
    python -m evalm.icl_eval ppl --checkpoint DIR --books PG19/test --out runs/ppl   # one process

The arguments are exactly those of `evalm eval icl|ppl|harness|recall`; `icl`, `ppl` and `recall` split their work
into units over the ranks (`icl_eval.protocol.units`) and rank 0 writes the one results.json.
"""

import sys

from evalm.config_toolkit.environment import command_environment
from evalm.icl_eval.cli import main

if __name__ == "__main__":
    command_environment()
    sys.exit(main())
