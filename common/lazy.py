"""A package's public names, imported on first use (PEP 562's module `__getattr__`).

`tk` starts by importing its packages; a package whose `__init__` imported its modules would
bring in NumPy and the rest before a command is even chosen (`tk --help` would wait for them).
Each package instead lists where its names live, and the first `tokenkit.bpe.Tokenizer` (or
`from tokenkit.bpe import Tokenizer`) imports that one module.

What it does not do: hide submodules (`from tokenkit.bpe import io` imports bpe/io.py as Python
always does), or import anything itself.
"""

from __future__ import annotations

import importlib


def lazy_names(package: str, homes: dict[str, str]):
    """-> (`__getattr__`, `__dir__`) for `package`, whose name N lives in module `homes[N]` (relative
    to the package). A name found is kept in the package's namespace, so it is looked up once."""

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(homes)

    return __getattr__, __dir__
