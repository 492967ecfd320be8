"""`python -m gdn.manifest`: the probe's manifest (gdn.matrix.probe), under the name the README and the
cell images have always run it by."""

from __future__ import annotations

import sys

from gdn.matrix.probe import main

if __name__ == "__main__":
    sys.exit(main())
