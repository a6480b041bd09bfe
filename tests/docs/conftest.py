"""The docs tests import the generators from tools/ (outside the installed packages): put the repository root first."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
