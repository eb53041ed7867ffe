"""How runs keep their files, on the ground floor (of ours it imports only the user-error types of
`config_toolkit.errors`, its floor-mate).

- `lock`: one owner per output folder, an OS lock released when its holder dies;
- `digest`: a folder's files with their sizes and SHA-256, written last and verified before use;
- `files`: JSON and text read so that a damaged or foreign file is named, never half-used, and
  writes that say "no space left" with the file when the disk is full;
- `secrets`: a URL's password masked (`redis://user:***@host`) wherever a run records or prints text.
"""

from evalm.storage.digest import verify_digest, write_digest
from evalm.storage.files import DamagedFile, NoSpace, read_json, read_text, space_error
from evalm.storage.lock import FolderBusy, folder_lock
from evalm.storage.secrets import redact, redact_argv, redact_value

__all__ = ["DamagedFile", "FolderBusy", "NoSpace", "folder_lock", "read_json", "read_text", "redact",
           "redact_argv", "redact_value", "space_error",
           "verify_digest", "write_digest"]
