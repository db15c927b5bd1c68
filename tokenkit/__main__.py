"""`python -m tokenkit ...` runs `tk ...`."""

from tokenkit.cli.main import entry

entry()
