"""``python -m controller.cli`` is ``dispatchctl``."""

import sys

from controller.cli.app import main

sys.exit(main())
