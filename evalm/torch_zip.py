"""The tensor names of a `torch.save` file (a `.bin` model's weights), read without unpickling it.

Since torch 1.6 `torch.save` writes a zip: `ARCHIVE/data.pkl` pickles the state dict (its keys are
the tensor names, each value a call that rebuilds a tensor from a storage), `ARCHIVE/data/N` hold the
storages' bytes. Unpickling runs whatever the pickle asks for; `pickletools.genops` only lists its
opcodes, so the names are the strings the pickle pushes (a dotted string: a tensor's name or a
module path such as `torch._utils`, which counts no layer). Enough to count the layers the weights
hold (evalm/hf_weights.py) before any model is built; `transformers` itself loads them with
`weights_only=True`.
"""

from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path

from evalm.storage import DamagedFile
from evalm.storage.files import MiB

MAX_PICKLE_BYTES = 64 * MiB
"""A state dict's pickle holds names and storage keys: kilobytes per tensor, far under this."""
STRINGS = ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING")


def tensor_names(path: Path) -> list[str]:
    """The dotted strings the pickle of the `torch.save` zip `path` pushes (its tensor names among them), or one
    line naming the file when it is not such a zip."""
    remedy = "download the model again, or save its weights as safetensors"
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [info for info in archive.infolist() if info.filename.endswith("/data.pkl")]
            if len(pickles) != 1 or pickles[0].file_size > MAX_PICKLE_BYTES:
                raise DamagedFile(f"{path}: not the zip `torch.save` writes (no single data.pkl of at most "
                                  f"{MAX_PICKLE_BYTES // MiB} MiB); {remedy}")
            raw = archive.read(pickles[0])
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as err:
        raise DamagedFile(f"{path}: not a readable zip of `torch.save` (saved before torch 1.6, or damaged: "
                          f"{str(err)[:100]}); {remedy}") from None
    try:
        return [arg for op, arg, _ in pickletools.genops(raw) if op.name in STRINGS and isinstance(arg, str)
                and "." in arg]
    except (ValueError, EOFError) as err:  # genops' own words for a pickle it cannot list
        raise DamagedFile(f"{path}: its data.pkl is not a pickle ({str(err)[:100]}); {remedy}") from None
