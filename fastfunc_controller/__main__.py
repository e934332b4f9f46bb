"""``python -m fastfunc_controller``."""

import sys

from fastfunc_controller.main import main

sys.exit(main())
