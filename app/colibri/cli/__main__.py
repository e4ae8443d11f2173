"""`python -m colibri.cli`: the `colibri` command."""

import sys

from colibri.cli import main

sys.exit(main())
