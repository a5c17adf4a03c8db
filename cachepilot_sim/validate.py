"""`python -m cachepilot_sim.validate`: the documented entry of tools/validate.py."""

import sys

from cachepilot_sim.tools.validate import main

if __name__ == "__main__":
    sys.exit(main())
