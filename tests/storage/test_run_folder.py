"""`storage.RunFolder` and its parts on real files: identities, atomic writes, recorded settings,
what `--overwrite` may delete, the lock's refusals, rank-0 sharing in a world of one.

Run: python -m pytest tests/storage -q

Every identity is checked against `hashlib` over the file's bytes (an independent oracle); every
refusal against the files it must leave untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading

import pytest

from evalm.config_toolkit import UserError, is_user_error
from evalm.storage import (DigestCache, ForeignLock, NotAFolder, NotOurs, Ranks, RankZeroFailed, RunFolder,
                           SettingsChanged, folder_lock, identity, made_by, replaced, write_atomic)
from evalm.storage.files import temporaries
from evalm.storage.run_folder import DIGESTS


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_a_file_is_known_by_its_bytes_and_a_folder_by_its_visible_files(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(os.urandom(3 << 20))  # several read blocks
    assert identity(f) == _sha(f.read_bytes())
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.json").write_text("{}")
    (folder / "sub" / "b.bin").write_bytes(b"\x00\x01")
    line = "".join(f"{name}\0{hashlib.sha256(data).hexdigest()}\n" for name, data in (("a.json", b"{}"), ("sub/b.bin", b"\x00\x01")))
    assert identity(folder) == _sha(line.encode())
    (folder / ".evalm.lock").write_text("a lock record that changes every run")
    assert identity(folder) == _sha(line.encode())  # bookkeeping of a run is not what the folder holds
    (folder / "sub" / "b.bin").write_bytes(b"\x00\x02")
    assert identity(folder) != _sha(line.encode())
    assert identity(tmp_path / "missing") is None


def test_the_cache_is_used_while_a_file_is_untouched_and_never_after_a_rewrite_hidden_by_touch_r(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"old weights " * 1000)
    cache_file = tmp_path / DIGESTS
    cache = DigestCache(cache_file)
    assert cache.identity(f) == _sha(f.read_bytes())
    cache.save()
    # the cache is read: a planted digest for the unchanged stamp is returned as is
    entries = json.loads(cache_file.read_text())
    entries[str(f.resolve())]["sha256"] = "0" * 64
    cache_file.write_text(json.dumps(entries))
    assert DigestCache(cache_file).sha256(f) == "0" * 64
    # other bytes of the same size, written in place (same inode), the times set back as `touch -r` does
    before = os.stat(f)
    with open(f, "r+b") as handle:
        handle.write(b"new weights " * 1000)
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(f)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert DigestCache(cache_file).identity(f) == _sha(b"new weights " * 1000)


def test_a_fifo_or_a_device_is_never_read(tmp_path):
    """A FIFO would block the read forever and /dev/zero never ends: their identity says what they are, and
    the command that reads them refuses them (tests/hostile/test_bounds.py: books)."""
    fifo = tmp_path / "book.txt"
    os.mkfifo(fifo)
    (tmp_path / "zero.jsonl").symlink_to("/dev/zero")
    result: list = []
    reader = threading.Thread(target=lambda: result.extend([identity(fifo), identity(tmp_path / "zero.jsonl")]),
                              daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert result == ["special:fifo", "special:device"], "identity() read a FIFO or a device"


def test_a_replaced_file_is_old_or_new_never_half(tmp_path):
    path = tmp_path / "key.json"
    write_atomic(path, "old")
    with pytest.raises(RuntimeError):
        with replaced(path) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old" and not temporaries(tmp_path)
    write_atomic(path, b"new")
    assert path.read_text() == "new" and not temporaries(tmp_path)


def _advice(changed: list[str]) -> str:
    return f"relaunch with the recorded {', '.join(changed)}"


def test_recorded_settings_continue_refuse_or_take_a_run_only_change(tmp_path):
    folder = RunFolder(tmp_path / "out", "evalm demo")
    settings = {"tasks": 2, "config": {"min_words": 20}, "index": {"url": "a"}}
    assert folder.record("config.json", settings, ignore=("index",), advice=_advice) is True
    assert folder.record("config.json", settings, ignore=("index",), advice=_advice) is False
    with pytest.raises(SettingsChanged) as refused:
        folder.record("config.json", {**settings, "tasks": 3, "config": {"min_words": 5}}, ignore=("index",),
                      advice=_advice)
    assert str(refused.value) == (f"{tmp_path / 'out'} was made with other settings: config.min_words: recorded 20, "
                                  "now 5; tasks: recorded 2, now 3. relaunch with the recorded config.min_words, tasks")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tasks"] == 2  # nothing recorded
    assert folder.record("config.json", {**settings, "index": {"url": "b"}}, ignore=("index",), advice=_advice) is False
    assert json.loads((tmp_path / "out" / "config.json").read_text())["index"] == {"url": "b"}
    # a key that folders recorded before it existed lack: accepted only where it is declared so
    assert folder.record("config.json", {**settings, "index": {"url": "b"}, "sha": "x"}, ignore=("index",),
                         added=("sha",), advice=_advice) is False
    with pytest.raises(SettingsChanged, match="other: recorded None, now 'y'"):
        folder.record("config.json", {**settings, "other": "y"}, advice=_advice)


def test_overwrite_deletes_only_a_folder_the_same_command_made_and_never_an_input(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text("{}")
    (theirs / "keep").write_text("a user's file")
    # a folder with files in it that this command did not make is not even held (the one rule of every
    # command that writes a folder), so --overwrite never reaches it
    with pytest.raises(NotOurs, match="writes only into a folder it made or an empty one.*has no .evalm-folder.json"):
        with RunFolder(theirs, "evalm data filter").held():
            pass
    assert made_by(theirs) is None and (theirs / "keep").read_text() == "a user's file"

    other = RunFolder(tmp_path / "run", "evalm train pretrain")
    with other.held():
        (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(NotOurs, match="it was made by `evalm train pretrain`"):
        with RunFolder(tmp_path / "run", "evalm data filter").held():
            pass
    assert (tmp_path / "run" / "metrics.jsonl").is_file()

    mine = RunFolder(tmp_path / "mine", "evalm data filter")
    with mine.held():
        (tmp_path / "mine" / "documents").mkdir()
        (tmp_path / "mine" / "input.jsonl").write_text("{}\n")
    with mine.held():
        with pytest.raises(NotOurs, match="overlaps the input"):
            mine.discard(inputs=[tmp_path / "mine" / "input.jsonl"])
        with pytest.raises(NotOurs, match="overlaps the input"):
            mine.discard(inputs=[tmp_path / "mine" / "documents" / "x"])
        assert (tmp_path / "mine" / "input.jsonl").is_file()
        mine.discard(inputs=[tmp_path / "elsewhere.jsonl"])
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == [".evalm-folder.json", ".evalm.lock"]
    assert made_by(tmp_path / "mine") == "evalm data filter"


def test_the_lock_never_follows_or_truncates_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / ".evalm.lock").symlink_to(victim)
    with pytest.raises(ForeignLock, match="is a symbolic link"):
        with folder_lock(folder, "evalm demo"):
            pass
    assert victim.read_text() == "precious\n"
    (folder / ".evalm.lock").unlink()
    os.link(victim, folder / ".evalm.lock")
    with pytest.raises(ForeignLock, match="2 names"):
        with folder_lock(folder, "evalm demo"):
            pass
    assert victim.read_text() == "precious\n"
    (folder / ".evalm.lock").unlink()
    os.mkfifo(folder / ".evalm.lock")
    with pytest.raises(ForeignLock, match="not a regular file"):
        with folder_lock(folder, "evalm demo"):
            pass


def test_an_output_that_is_a_file_is_one_line(tmp_path):
    out = tmp_path / "results.json"
    out.write_text("{}")
    with pytest.raises(NotAFolder) as refused:
        with RunFolder(out, "evalm demo").held():
            pass
    assert is_user_error(refused.value) and "exists and is not a folder" in str(refused.value)
    assert out.read_text() == "{}"


def test_the_lock_records_the_command_line_without_a_password(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["evalm", "data", "dedup", "--redis-url", "redis://me:hunter2@db:6379/0"])
    with folder_lock(tmp_path / "out", "evalm data dedup"):
        record = json.loads((tmp_path / "out" / ".evalm.lock").read_text())
    assert record["argv"][-1] == "redis://me:***@db:6379/0"
    assert "hunter2" not in (tmp_path / "out" / ".evalm.lock").read_text()


def test_rank_zero_shares_its_value_or_its_error_in_a_world_of_one():
    """One process; the two-rank path (a broadcast through gloo) is tests/hostile/test_run_folders.py."""
    ranks = Ranks()
    assert ranks.share(lambda: 41 + 1) == 42
    with pytest.raises(ZeroDivisionError):
        ranks.share(lambda: 1 / 0)
    with pytest.raises(SettingsChanged):
        ranks.share(_raise(SettingsChanged("x")))


def _raise(error: BaseException):
    def action():
        raise error

    return action


def test_other_ranks_hear_rank_zeros_error_as_the_kind_it_was():
    """What rank 0 broadcasts, handed to rank 1 as a broadcast would: a user error stays one, a bug a bug."""
    def round_trip(error: BaseException):
        sent: list = []
        with pytest.raises(type(error)):  # rank 0 raises its own error, after telling the others
            Ranks(0, 2, lambda box: sent.append(list(box))).share(_raise(error))
        never = _raise(AssertionError("rank 1 ran rank 0's action"))
        return Ranks(1, 2, lambda box: box.__setitem__(0, sent[0][0])).share(never)

    with pytest.raises(UserError, match="^a config key$"):
        round_trip(SettingsChanged("a config key"))
    with pytest.raises(RankZeroFailed, match="rank 0 failed with ZeroDivisionError: division by zero"):
        round_trip(ZeroDivisionError("division by zero"))
    assert not is_user_error(RankZeroFailed("x"))
    sent: list = []
    assert Ranks(0, 2, lambda box: sent.append(list(box))).share(lambda: 7) == 7
    assert Ranks(1, 2, lambda box: box.__setitem__(0, sent[0][0])).share(_raise(AssertionError())) == 7
