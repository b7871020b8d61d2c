"""`python -m ernie.autoplan`: the plan search's command line, `main` of
the package (run from here, not as a second copy of the package's module,
so the search's worker processes find its functions in ernie.autoplan)."""

import sys

from . import main

sys.exit(main())
