"""Reading a DCP checkpoint's `.metadata` without running anything it names.

`torch.distributed.checkpoint.FileSystemReader.read_metadata` is a plain `pickle.load`: a crafted
`.metadata` whose `__reduce__` names `os.system` or `open` runs it the moment a resume, an
`init_from` or an export looks at the checkpoint, before any check can fail. `MetadataReader`
reads the same file with an unpickler that can build only what a checkpoint's metadata is made of
(DCP's metadata dataclasses, dtypes, sizes, layouts, paths), so a crafted file is refused with
its name and nothing runs. Tensor and byte payloads are read by DCP with `weights_only=True`
(tensors) and by `SafeLoadPlanner` (plain values), the two other places a checkpoint unpickles.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from evalm.config_toolkit import UserError

_DCP = "torch.distributed.checkpoint"
ALLOWED = {
    *((f"{_DCP}.metadata", name) for name in (
        "Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata", "BytesStorageMetadata",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")),
    (f"{_DCP}.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout from its name, e.g. "torch.strided"
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}
"""(module, name) a `.metadata` written by `dcp.save` refers to, besides `torch.<dtype>`."""


class UnsafeMetadata(UserError, pickle.UnpicklingError):
    """A `.metadata` that names something a checkpoint never holds."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise UnsafeMetadata(f"{module}.{name}")


class MetadataReader(FileSystemReader):
    """FileSystemReader whose `.metadata` is unpickled with the allow-list above."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        metadata = read_metadata_file(path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def read_metadata_file(path: Path) -> Metadata:
    """The Metadata in `path`, or UnsafeMetadata / UnpicklingError naming the file."""
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f).load()
        except UnsafeMetadata as err:
            raise UnsafeMetadata(f"{path}: refused: it asks to load {err}, which a checkpoint's metadata never "
                                 "holds (a crafted or foreign file); nothing from it was run. Do not use this "
                                 "checkpoint; resume from another one") from None
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
            raise pickle.UnpicklingError(f"{path}: damaged checkpoint metadata ({err})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeMetadata(f"{path}: refused: it holds a {type(metadata).__name__}, not checkpoint metadata")
    return metadata


def storage_problem(folder: Path, metadata: Metadata, read: bool) -> str | None:
    """Why the files of a checkpoint cannot hold what its `.metadata` lists, else None: every item's file
    must be there and reach the item's last byte; with `read`, every item must also load (as DCP loads
    it: `torch.load(weights_only=True)`). The digest, when a checkpoint has one, proves more (every
    byte); this is what can be proved without it (a checkpoint saved before digests, or one whose
    digest.json was lost): a cut or zeroed file, never a flipped bit inside a tensor."""
    by_file: dict[str, list[tuple[int, int, str, bool]]] = {}
    for index, info in metadata.storage_data.items():
        plain = not getattr(info, "transform_descriptors", None)  # a compressed item is DCP's to decode
        by_file.setdefault(str(info.relative_path), []).append((info.offset, info.length, index.fqn, plain))
    for name, items in sorted(by_file.items()):
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size, end = path.stat().st_size, max(offset + length for offset, length, _, _ in items)
        if end > size:
            return f"{path} has {size} bytes, but its items reach byte {end} (truncated)"
        problem = _unloadable(path, sorted(items)) if read else None
        if problem:
            return problem
    return None


def _unloadable(path: Path, items: list[tuple[int, int, str, bool]]) -> str | None:
    with open(path, "rb") as f:
        for offset, length, fqn, plain in items:
            if not plain:
                continue
            f.seek(offset)
            try:
                torch.load(io.BytesIO(f.read(length)), map_location="cpu", weights_only=True)
            except Exception as err:  # noqa: BLE001 - any failure to load the item is the answer
                return f"{path}: item {fqn} (bytes {offset}-{offset + length}) cannot be read ({str(err).splitlines()[0]})"
    return None


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner, but non-tensor values are unpickled with `weights_only=True`."""

    def load_bytes(self, read_item, value) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
