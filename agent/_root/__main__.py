"""`python -m rooflight`: the same command line as `rooflight`."""

import sys

from rooflight.agent.cli import main

sys.exit(main())
