"""``python -m qlinear``: the ``qlinear`` command."""

import sys

from qlinear.cli import main

sys.exit(main())
