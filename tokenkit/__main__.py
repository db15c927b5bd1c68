"""`python -m tokenkit ...` runs `tk ...`."""

import sys

from tokenkit.cli.main import main

sys.exit(main())
