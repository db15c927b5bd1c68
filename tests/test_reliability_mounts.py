"""Export directories that are mount points (issue 36): `tk export-hf` and `tk bpe-export` into an
empty tmpfs or a bind mount (a Docker volume), whose directory cannot be renamed, and with
--overwrite into one that holds an earlier export.

- into either kind of mount, empty or holding an earlier export, the export works, the mount
  stays the same directory, a file of the user's stays, and no staging folder is left;
- a directory that is not an earlier export is refused without --overwrite, as anywhere else;
- interrupted at each file, the mount holds the whole old export; killed among the moves, the
  next call finishes them (these two on a plain directory as well, where mounting is refused);
- a mount point the mount table does not name is still replaced (the swap's EBUSY or EXDEV
  falls back), and a mount point with a space in its name is read from the table.

Mounting needs root (or CAP_SYS_ADMIN): those tests skip, saying so, where `mount` is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability_files import (
    TEXT,
    Interrupt,
    assert_users_files,
    cli,
    export_state,
    one_line_error,
    read_like_transformers,
    two_models,  # noqa: F401 -- a fixture: two models and their exports
    users_files,
)

from tokenkit.bpe import Tokenizer
from tokenkit.common import atomic_dir

KINDS = ["tmpfs", "bind"]


@contextlib.contextmanager
def mount_point(tmp_path: Path, kind: str, name: str = "vol"):
    """A directory `name` under tmp_path with an empty tmpfs, or an empty folder bound, mounted on
    it; unmounted after. Skips where this process may not mount."""
    point = tmp_path / name
    point.mkdir()
    if kind == "tmpfs":
        argv = ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(point)]
    else:
        (tmp_path / f"{name}-source").mkdir()
        argv = ["mount", "--bind", str(tmp_path / f"{name}-source"), str(point)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except OSError as err:
        pytest.skip(f"cannot run mount: {err}")
    if done.returncode != 0:
        pytest.skip(f"mounting is not permitted here: {done.stderr.strip()[:200]}")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], capture_output=True, timeout=60)


def is_mounted(point: Path) -> bool:
    return not atomic_dir._swappable(Path(os.path.realpath(point)))


def no_debris(d: Path) -> None:
    """No staging folder inside `d` and no temp directory or note beside it."""
    inside = [p.name for p in d.iterdir() if p.name.startswith(".tk-")]
    beside = [p.name for p in d.parent.iterdir() if p.name.startswith(f".{d.name}.tk-")]
    assert inside == [] and beside == [], (inside, beside)


# ----------------------------------------------------------------------------- export-hf


@pytest.mark.parametrize("kind", KINDS)
def test_export_hf_into_a_mount_point_and_over_an_earlier_export(kind, two_models, tmp_path, capsys):  # noqa: F811
    (old_model, old_state), (new_model, new_state) = two_models["old"], two_models["new"]
    with mount_point(tmp_path, kind) as d:
        inode = d.stat().st_ino
        code, _, err = cli(capsys, "export-hf", old_model, "-o", d)
        assert code == 0, err
        assert export_state(d) == old_state and read_like_transformers(d) == (300, 32)
        no_debris(d)
        users_files(d)
        for model, state, shape in ((new_model, new_state, (280, 64)), (old_model, old_state, (300, 32))):
            code, _, err = cli(capsys, "export-hf", model, "-o", d, "--overwrite")
            assert code == 0, err
            assert export_state(d) == state and read_like_transformers(d) == shape
            assert_users_files(d)
            no_debris(d)
        assert is_mounted(d) and d.stat().st_ino == inode  # the mount itself, not a directory put over it
        assert cli(capsys, "import-hf", d, "-o", tmp_path / "back.safetensors")[0] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_export_hf_into_a_mount_of_the_users_files_needs_overwrite_and_keeps_them(
    kind,
    two_models,  # noqa: F811
    tmp_path,
    capsys,
):
    new_model, new_state = two_models["new"]
    with mount_point(tmp_path, kind) as d:
        (d / "notes.txt").write_text("mine", encoding="utf-8")
        one_line_error(*cli(capsys, "export-hf", new_model, "-o", d)[::2], "not an earlier export", "--overwrite")
        assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]
        code, _, err = cli(capsys, "export-hf", new_model, "-o", d, "--overwrite")
        assert code == 0, err
        assert export_state(d) == new_state and (d / "notes.txt").read_text(encoding="utf-8") == "mine"
        no_debris(d)


@pytest.mark.parametrize("kind", KINDS)
def test_export_hf_into_a_mount_interrupted_at_each_file_leaves_the_old_export_whole(
    kind,
    two_models,  # noqa: F811
    tmp_path,
    capsys,
    monkeypatch,
):
    (old_model, old_state), (new_model, new_state) = two_models["old"], two_models["new"]
    with mount_point(tmp_path, kind) as d:
        assert cli(capsys, "export-hf", old_model, "-o", d)[0] == 0
        users_files(d)
        for n in range(20):
            with monkeypatch.context() as m:
                Interrupt(m, n, OSError(errno.ENOSPC, "No space left on device"))
                code, _, err = cli(capsys, "export-hf", new_model, "-o", d, "--overwrite")
            if code == 0:
                break
            one_line_error(code, err, "disk is full")
            assert export_state(d) == old_state, f"interrupted after {n} files"
            assert_users_files(d)
            no_debris(d)
        assert n > 5 and export_state(d) == new_state
        assert_users_files(d)
        no_debris(d)


# ----------------------------------------------------------------------------- bpe-export


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["gpt2", "hf", "tiktoken"])
def test_bpe_export_into_a_mount_point_and_over_an_earlier_one(kind, fmt, tmp_path, capsys):
    for name, vocab in (("old", 300), ("new", 280)):
        tok = tmp_path / f"{name}.safetensors"
        Tokenizer.train([TEXT.encode()], vocab_size=vocab, special_tokens=["<|endoftext|>"]).save(tok)
        assert cli(capsys, "bpe-export", tok, "--format", fmt, "-o", tmp_path / name)[0] == 0
    old_state, new_state = export_state(tmp_path / "old"), export_state(tmp_path / "new")
    with mount_point(tmp_path, kind) as d:
        code, _, err = cli(capsys, "bpe-export", tmp_path / "old.safetensors", "--format", fmt, "-o", d)
        assert code == 0, err
        assert export_state(d) == old_state
        users_files(d)
        no_debris(d)
        line = one_line_error(*cli(capsys, "bpe-export", tmp_path / "new.safetensors", "--format", fmt, "-o", d)[::2])
        assert "--overwrite" in line and export_state(d) == old_state
        code, _, err = cli(capsys, "bpe-export", tmp_path / "new.safetensors", "--format", fmt, "-o", d, "--overwrite")
        assert code == 0, err
        assert export_state(d) == new_state and is_mounted(d)
        assert_users_files(d)
        no_debris(d)


# ----------------------------------------------------------------------------- the mechanism

KILLED_IN_PLACE = """
import os, sys
from pathlib import Path
from tokenkit.common import atomic, atomic_dir
d, when = Path(sys.argv[1]).resolve(), sys.argv[2]
atomic_dir._swappable = lambda directory: False  # as a mount point is
real_replace, real_create = os.replace, atomic.create_temp
def replace(src, dst):
    real_replace(src, dst)
    if when == "moving" and Path(dst).parent == d:  # one new file is in, the others not yet
        os._exit(9)
def create_temp(tmp):
    if when == "writing" and Path(tmp).name == "b":  # the first new file written, the second not
        os._exit(9)
    return real_create(tmp)
os.replace, atomic.create_temp = replace, create_temp
atomic_dir.replace_files(d, {"a": b"new a", "b": b"new b"}, remove=["c"])
"""


@pytest.mark.parametrize("where", ["plain", "tmpfs"])
@pytest.mark.parametrize("when", ["writing", "moving"])
def test_a_replacement_in_place_killed_midway_is_finished_or_undone_by_the_next_call(tmp_path, where, when):
    """Killed while the new files are staged: the old set stays and the staging goes; killed
    among the moves (its note written): the next call finishes them. The user's files stay."""
    with contextlib.ExitStack() as stack:
        d = tmp_path / "vol"
        if where == "plain":
            d.mkdir()
        else:
            d = stack.enter_context(mount_point(tmp_path, where))
        for name, data in (("a", b"old a"), ("b", b"old b"), ("c", b"old c")):
            (d / name).write_bytes(data)
        users_files(d)
        assert subprocess.run([sys.executable, "-c", KILLED_IN_PLACE, str(d), when]).returncode == 9
        assert [p.name for p in d.iterdir() if p.name.startswith(".tk-replace-")]  # what the kill left
        atomic_dir.recover_replacements(d)
        found = {name: (d / name).read_bytes() for name in "abc" if (d / name).exists()}
        if when == "writing":
            assert found == {"a": b"old a", "b": b"old b", "c": b"old c"}
        else:
            assert found == {"a": b"new a", "b": b"new b"}
        assert_users_files(d)
        no_debris(d)


def test_a_mount_the_table_does_not_name_is_still_replaced(tmp_path, monkeypatch):
    """Where the mount table is not read (another system), the swap's EBUSY or EXDEV is undone
    and the files are replaced in place."""
    with mount_point(tmp_path, "bind") as d:
        atomic_dir.replace_files(d, {"a": b"old"})
        users_files(d)
        monkeypatch.setattr(atomic_dir, "_mount_points", set)
        monkeypatch.setattr(os.path, "ismount", lambda path: False)
        assert atomic_dir._swappable(Path(os.path.realpath(d)))  # taken for an ordinary directory
        assert atomic_dir.replace_files(d, {"a": b"new"}, remove=["z"]) == []
        assert (d / "a").read_bytes() == b"new"
        assert_users_files(d)
        no_debris(d)


def test_a_mount_point_with_a_space_is_named_by_the_table(tmp_path):
    with mount_point(tmp_path, "bind", name="my vol\tx") as d:
        assert os.fsencode(os.path.realpath(d)) in atomic_dir._mount_points()
        assert not os.path.ismount(d)  # a bind mount of the same file system: the table alone says so
        atomic_dir.replace_files(d, {"a": b"1"})
        assert (d / "a").read_bytes() == b"1"
        no_debris(d)


def test_ctrl_c_among_the_moves_still_ends_all_new(tmp_path, monkeypatch):
    """Once the note of the moves is written, Ctrl-C at the first move is answered by finishing
    them before it goes up: all new, nothing staged left."""
    d = tmp_path / "vol"
    d.mkdir()
    for name in "abc":
        (d / name).write_bytes(b"old " + name.encode())
    monkeypatch.setattr(atomic_dir, "_swappable", lambda directory: False)
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the note's own rename first, then the first move
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        atomic_dir.replace_files(d, {"a": b"new a", "b": b"new b"}, remove=["c"])
    assert {p.name: p.read_bytes() for p in d.iterdir()} == {"a": b"new a", "b": b"new b"}


@pytest.mark.parametrize("kind", ["plain", "tmpfs"])
def test_what_a_killed_first_export_left_in_place_does_not_block_the_next(kind, two_models, tmp_path, capsys):  # noqa: F811
    """An export killed while writing into an empty mount leaves its staging folder there; the
    next export (no --overwrite) clears it and works."""
    new_model, new_state = two_models["new"]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with contextlib.ExitStack() as stack:
        d = tmp_path / "vol"
        if kind == "plain":
            d.mkdir()
            stack.enter_context(pytest.MonkeyPatch.context()).setattr(atomic_dir, "_swappable", lambda directory: False)
        else:
            d = stack.enter_context(mount_point(tmp_path, kind))
        staged = d / f".tk-replace-{dead.pid}-0123abcd"
        staged.mkdir()
        (staged / "model.safetensors").write_bytes(b"half a model")
        code, _, err = cli(capsys, "export-hf", new_model, "-o", d)
        assert code == 0, err
        assert export_state(d) == new_state
        no_debris(d)
