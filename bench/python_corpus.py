"""Build a large corpus of distinct text from this machine's Python installation.

    python bench/python_corpus.py [--mb 200] [-o /tmp/tokenkit-python-corpus.txt] [--kinds py]

Walks the standard library and every site-packages directory (sorted by path, symlinks not
followed), keeps the files with the given extensions that are valid UTF-8, drops exact
duplicates (by sha256 of the bytes: the same module vendored twice is read once), and writes
them one after the other (a newline between files) until --mb megabytes are written. The result
is deterministic for a given installation; another machine's packages give another corpus.
`--kinds py,pyi,txt,md,rst,...` takes more kinds of text files and `--roots DIR ...` walks more
directories after the installation (other Python versions, /usr), for corpora beyond what the
Python source holds. Prints the file's size, the number of files and how many were duplicates.

The corpus goes to /tmp by default: it is hundreds of megabytes, never to be kept in the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import site
import sys
import sysconfig
from pathlib import Path

DEFAULT_OUT = Path("/tmp/tokenkit-python-corpus.txt")


def python_roots() -> list[Path]:
    """The standard library and site-packages directories, each once, sorted; nested ones
    (site-packages inside the stdlib directory) are walked as part of their parent."""
    paths = sysconfig.get_paths()
    found = {paths["stdlib"], paths["purelib"], paths["platlib"], *site.getsitepackages()}
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        found.add(site.getusersitepackages())
    roots = sorted(Path(p).resolve() for p in found if os.path.isdir(p))
    return [r for r in roots if not any(r != other and r.is_relative_to(other) for other in roots)]


def source_files(roots: list[Path], kinds: tuple[str, ...]):
    """Every file under `roots` whose name ends in one of `kinds`, in sorted path order."""
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):  # does not follow symlinked directories
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(kinds):
                    path = Path(dirpath) / name
                    if path.is_file() and not path.is_symlink():
                        yield path


def build(out: Path, limit_bytes: int, kinds: tuple[str, ...], extra_roots: list[Path] = ()) -> dict:
    seen: set[bytes] = set()
    written = files = duplicates = not_utf8 = 0
    tmp = out.with_name(out.name + ".partial")
    with open(tmp, "wb") as f:
        for path in source_files(python_roots() + [Path(r).resolve() for r in extra_roots], kinds):
            try:
                data = path.read_bytes()
            except OSError:
                continue
            digest = hashlib.sha256(data).digest()
            if digest in seen:
                duplicates += 1
                continue
            seen.add(digest)
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                not_utf8 += 1
                continue
            if not data.strip():
                continue
            f.write(data + b"\n")  # whole files: the last one may go a little past the limit
            written += len(data) + 1
            files += 1
            if written >= limit_bytes:
                break
    os.replace(tmp, out)
    return {
        "path": str(out),
        "bytes": written,
        "files": files,
        "duplicates_skipped": duplicates,
        "not_utf8_skipped": not_utf8,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=200.0, help="stop after this many megabytes (1e6 bytes)")
    parser.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--kinds", default="py", help="comma-separated file extensions (default: py)")
    parser.add_argument(
        "--roots", nargs="*", type=Path, default=[], help="more directories to walk, in the order given"
    )
    args = parser.parse_args()
    kinds = tuple("." + k.strip().lstrip(".") for k in args.kinds.split(",") if k.strip())
    info = build(args.out, int(args.mb * 1e6), kinds, args.roots)
    mb = info["bytes"] / 1e6
    note = "" if mb >= args.mb * 0.999 else f" (all there is: asked for {args.mb:g} MB)"
    print(
        f"wrote {info['path']}: {mb:.1f} MB{note} from {info['files']:,} files; "
        f"{info['duplicates_skipped']:,} duplicates and {info['not_utf8_skipped']:,} non-UTF-8 files skipped"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
