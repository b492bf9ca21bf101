"""`python -m runtime.host`: serve one host (see runtime.host)."""

import sys

from . import main

sys.exit(main())
