"""The server tests' raw WebSocket helpers (``ws_frames.py``) made importable.

--import-mode=importlib keeps test directories off sys.path; the helpers are a
plain module beside the tests, so this directory is put on it.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
