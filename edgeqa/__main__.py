from __future__ import annotations

import sys

from edgeqa.cli import main

sys.exit(main())
