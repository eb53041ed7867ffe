"""A local `datasets` cache laid out as `load_dataset(id, config)` leaves it on a machine with network.

There, `load_dataset("nyu-mll/glue", "sst2")` runs the packaged `parquet` builder over the hub
repo's parquet files and writes Arrow files and `dataset_info.json` under
`$HF_HOME/datasets/nyu-mll___glue/sst2/0.0.0/<commit>/` (`glue-train.arrow`, ...). Offline
(`HF_DATASETS_OFFLINE=1`), `load_dataset` finds that folder through its `cache` builder. This
helper runs the same `parquet` builder, with a builder config named like the hub's, over parquet
files written by `datasets` itself, then gives the folder the hub's `namespace___name` form.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from evalm.text.data_source import cache_dir, datasets_module


def write_hub_cache(tmp: Path, repo: str, config: str | None, splits: dict[str, dict[str, list]],
                    commit: str = "0123456789abcdef0123456789abcdef01234567", version: str = "0.0.0",
                    max_shard_size: int | None = None, features=None) -> Path:
    """Cache `repo` (`namespace/name` or a legacy `name`) with one config and its splits; the folder.

    version "0.1.0" and a max_shard_size give what `datasets<4` leaves after running a loading
    script such as deepmind/pg19's (`pg19-train-00000-of-00003.arrow`, ...). `features` (a
    `datasets.Features`) types the columns as the hub's do, e.g. a ClassLabel with its label names."""
    ds = datasets_module()
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.parquet.parquet import Parquet, ParquetConfig

    namespace, _, name = repo.rpartition("/")
    source = tmp / f"parquet-{repo.replace('/', '--')}-{config}"
    source.mkdir(parents=True)
    files = {}
    for split, columns in splits.items():
        ds.Dataset.from_dict(columns, features=features).to_parquet(str(source / f"{split}.parquet"), batch_size=16)  # row groups
        files[split] = [str(source / f"{split}.parquet")]

    class HubParquet(Parquet):  # the hub repo's README config: a name with its data files
        BUILDER_CONFIGS = [ParquetConfig(name=config or "default", version=version,
                                         data_files=DataFilesDict.from_patterns(files))]

    builder = HubParquet(cache_dir=str(cache_dir()), dataset_name=name, config_name=config or "default", hash=commit)
    builder.download_and_prepare(max_shard_size=max_shard_size)
    written = Path(builder.cache_dir)
    if not namespace:
        return written
    target = cache_dir() / f"{namespace}___{name}" / written.relative_to(cache_dir() / name)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(written), str(target))
    shutil.rmtree(cache_dir() / name / written.parts[-3])  # the builder's empty folders and locks
    with contextlib.suppress(OSError):
        (cache_dir() / name).rmdir()
    return target
