import sys

from gdn.matrix.accuracy import main

sys.exit(main())
