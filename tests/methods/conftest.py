"""tests/methods/: one test file per policy loss in thinkrl/methods/, plus test_common.py for the shared helpers.

The batch builders the files share live in batches.py, imported as `from batches import ...`. This folder goes
on sys.path here, the way the root conftest.py puts tests/ there for tests/helpers.py and tests/tiny.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/methods/batches.py
