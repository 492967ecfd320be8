"""The gdn-matrix tooling: one image per software-stack cell, the same tests in each, a merged report."""
