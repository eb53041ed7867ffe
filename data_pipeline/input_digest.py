"""Input files keyed by content, so a relaunch notices a file that changed under the same name.

A stage folder records its settings on the first launch and refuses a relaunch whose settings
differ (runner.record_settings). Names alone would let an input rewritten in place pass, and the
stage would report `done` from outputs of the old bytes, or mix old and new tasks. Each input's
SHA-256 is therefore part of the settings. Hashing a Pile-scale input set takes minutes, so the
hashes are cached in the stage folder under (size, mtime, inode): a relaunch re-reads only a file
whose size, modification time or inode changed, which any ordinary rewrite changes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from evalm.storage.digest import sha256

CACHE = ".input-sha256.json"


def content_keys(root: Path, files: Sequence[str], output: Path) -> dict[str, str]:
    """{relative name: "sha256:..."} of the inputs, reusing output's cache where a file is unchanged."""
    cache_path = output / CACHE
    try:
        cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    except ValueError:
        cache = {}  # a damaged cache only costs the hashing again
    keys, fresh = {}, {}
    for name in files:
        st = os.stat(root / name)
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        known = cache.get(name)
        digest = known["sha256"] if known and known.get("stamp") == stamp else sha256(root / name)
        keys[name] = f"sha256:{digest}"
        fresh[name] = {"stamp": stamp, "sha256": digest}
    output.mkdir(parents=True, exist_ok=True)
    cache_path.write_text(json.dumps(fresh))
    return keys
