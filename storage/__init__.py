"""How runs keep their files, on the ground floor (of ours it imports only the user-error types of
`config_toolkit.errors`, its floor-mate).

- `run_folder`: `RunFolder`, the one owner of a command's output folder: its lock, its made-by
  marker and what `--overwrite` may delete, its recorded settings, its inputs' identities;
- `lock`: one owner per output folder, an OS lock released when its holder dies;
- `ranks`: work done once on rank 0 of a torchrun launch, its value or error shared with every rank;
- `settings`: recorded settings against a relaunch's, the differing keys in one line;
- `identity`: a file's identity by its bytes (streamed SHA-256, cached by `stat`);
- `digest`: a folder's files with their sizes and SHA-256, written last and verified before use; a
  folder's weights by their tensors (the same on any machine, whatever the file's metadata);
- `files`: JSON and text read so that a damaged or foreign file is named, never half-used, small inputs
  read as regular files of bounded size; writes whole or not at all, never through a link, and that say
  "no space left" with the file when the disk is full;
- `staging`: files written aside in a hidden folder and moved into place once complete;
- `secrets`: a URL's password masked (`redis://user:***@host`) wherever a run records or prints text;
- `streams`: document files read line by line with bounds (zstd frames checked to their end).
"""

from evalm.storage.digest import verify_digest, weights_digest, write_digest
from evalm.storage.files import (DamagedFile, LinkedOutput, NoSpace, NotRegular, read_bounded, read_json, read_text,
                                 refuse_link, regular, replaced, space_error, write_atomic, write_json)
from evalm.storage.identity import DigestCache, identity, sha256
from evalm.storage.lock import FolderBusy, ForeignLock, NotAFolder, folder_lock
from evalm.storage.ranks import Ranks, RankZeroFailed
from evalm.storage.run_folder import NotOurs, RunFolder, guard_inputs, inside, made_by, overlap
from evalm.storage.secrets import Secret, redact, redact_argv, redact_value
from evalm.storage.settings import SettingsChanged
from evalm.storage.staging import staged

__all__ = ["DamagedFile", "DigestCache", "FolderBusy", "ForeignLock", "LinkedOutput", "NoSpace", "NotAFolder",
           "NotOurs", "NotRegular", "RankZeroFailed", "Ranks", "RunFolder", "Secret", "SettingsChanged", "folder_lock",
           "guard_inputs", "identity", "inside", "made_by", "overlap", "read_bounded", "read_json", "read_text", "redact",
           "redact_argv", "redact_value", "refuse_link", "regular", "replaced", "sha256", "space_error", "staged",
           "verify_digest", "weights_digest", "write_atomic", "write_digest", "write_json"]
