"""``python -m scheduler_extender``: the same as ``fastgshare-extender``."""

import sys

from scheduler_extender.main import main

sys.exit(main())
