"""``python -m qlinear.bench``: the same as ``qlinear bench``."""

import sys

from qlinear.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
