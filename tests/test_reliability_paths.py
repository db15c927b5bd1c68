"""An output path that is not a regular file is refused in one line and never replaced.

Every command that writes renames a temp file over its output (common/atomic.py, and
common/atomic_dir.py for a directory of files). Where the path is a device node, a FIFO, a
socket or a link to one, that rename would put a regular file in the node's place (run as root,
`-o /dev/null` replaced the machine's /dev/null: issue 36). tk refuses such a path instead, in
one line, before any work, and leaves the node as it was: same type, same inode. The device
node here is a copy of /dev/null's numbers made in a temp directory (root only): the real one is
never put at risk.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path

import pytest
from test_reliability_hangs import TINY, base, cli, one_line  # noqa: F401 - base is a fixture

from tokenkit.common import FileError, atomic, atomic_dir

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FIFOs, sockets, device nodes")

NODES = ["fifo", "socket", "device", "link-to-device"]


def _make_node(kind: str, where: Path) -> tuple[Path, list]:
    """A node of `kind` at `where`; (the node, what must stay open while it is used)."""
    keep = []
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(where))
        keep.append(sock)
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        device = where if kind == "device" else where.with_name(where.name + ".dev")
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers, in a temp directory
        if kind == "link-to-device":
            where.symlink_to(device)
    return where, keep


def _identity(path: Path) -> tuple:
    """What must not change: the entry's own type and inode, and through a link its target's."""
    own = os.lstat(path)
    seen = (stat.S_IFMT(own.st_mode), own.st_ino)
    if stat.S_ISLNK(own.st_mode):
        target = os.stat(path)
        seen += (os.readlink(path), stat.S_IFMT(target.st_mode), target.st_ino)
    return seen


def _temps(directory: Path) -> list[str]:
    return [p.name for p in directory.rglob("*") if ".tk-" in p.name]


def _file_commands(made: dict, node: Path) -> list[list]:
    tok, corpus, hf, run = made["tok"], made["corpus"], made["hf"], made["run"]
    return [
        ["bpe-train", corpus, "--vocab-size", "280", "-o", node, "-q"],
        ["bpe-train", corpus, "--vocab-size", "280", "-o", node, "-q", "--workers", "2"],
        ["encode", "-t", tok, "the fox", "-o", node],
        ["encode", "-t", tok, "-f", corpus, "-o", node, "-q", "--workers", "2"],
        ["bpe-import", hf / "tokenizer.json", "-o", node],
        ["import-hf", hf, "-o", node],
        ["import-hf", hf, "-o", node, "--overwrite"],
        ["explain", "-m", run, "the fox", "--html", node],
        ["explain", "-m", run, "the fox", "--plot", node],
    ]


def _directory_commands(made: dict, node: Path) -> list[list]:
    tok, run, corpus = made["tok"], made["run"], made["corpus"]
    return [
        ["export-hf", run, "-o", node],
        ["bpe-export", tok, "--format", "hf", "-o", node],
        ["train-model", corpus, "-t", tok, "-o", node, *TINY, "--steps", "2", "-q"],
        ["pipeline", corpus, "-o", node, "--vocab-size", "280", *TINY, "--steps", "2", "-q"],
    ]


@pytest.mark.parametrize("kind", NODES)
def test_every_writer_refuses_a_node_as_its_output_and_leaves_it(base, tmp_path, capsys, kind):  # noqa: F811
    node, keep = _make_node(kind, tmp_path / "n")
    before = _identity(node)
    try:
        for argv in _file_commands(base, node):
            one_line(cli(capsys, *argv), str(node), "not a regular file")
            assert _identity(node) == before, argv
        for argv in _directory_commands(base, node):
            line = one_line(cli(capsys, *argv), str(node))
            assert "not a directory" in line or "give a directory" in line, line
            assert _identity(node) == before, argv
    finally:
        for sock in keep:
            sock.close()
    assert not _temps(tmp_path)


@pytest.mark.parametrize("kind", NODES)
def test_a_node_among_a_directorys_files_is_refused_and_left(base, tmp_path, capsys, kind):  # noqa: F811
    """An export's file (config.json, tokenizer.json) that is a node: the directory is not swapped."""
    for argv, name in [
        (["export-hf", base["run"], "--overwrite", "-o", tmp_path / "hf"], "config.json"),
        (["bpe-export", base["tok"], "--format", "hf", "--overwrite", "-o", tmp_path / "bpe"], "tokenizer.json"),
    ]:
        directory = Path(argv[argv.index("-o") + 1])
        directory.mkdir()
        (directory / "README").write_text("mine", encoding="utf-8")
        node, keep = _make_node(kind, directory / name)
        before = _identity(node)
        try:
            one_line(cli(capsys, *argv), name, "not a regular file")
        finally:
            for sock in keep:
                sock.close()
        assert _identity(node) == before
        assert (directory / "README").read_text(encoding="utf-8") == "mine"
    assert not _temps(tmp_path)


@pytest.mark.parametrize("kind", NODES)
def test_the_writer_itself_refuses_a_node_made_after_the_commands_check(tmp_path, kind):
    """The rule lives in the writer: `commit`, the rename every atomic write ends with, asks again."""
    target = tmp_path / "out.bin"
    with pytest.raises(FileError, match="not a regular file"):
        with atomic.atomic_path(target) as tmp:
            tmp.write_bytes(b"data")
            node, keep = _make_node(kind, target)  # appears between the check and the rename
            before = _identity(node)
    for sock in keep:
        sock.close()
    assert _identity(node) == before
    assert not _temps(tmp_path)
    with pytest.raises(FileError, match="not a directory"):
        atomic_dir.replace_files(node, {"a.txt": b"a"})
    assert _identity(node) == before


def test_regular_files_and_links_to_them_are_still_replaced(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    atomic.write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    link = tmp_path / "link"
    link.symlink_to(target)
    atomic.write_atomic(link, b"newer")  # as before: the link's name gets the new file
    assert link.read_bytes() == b"newer"
