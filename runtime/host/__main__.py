"""`python -m runtime.host`: serve one host (see runtime.host)."""

import sys

from . import main

__all__: list[str] = []

sys.exit(main())
