"""``python -m fastpod_crd_controller``: the same as the ``fastgshare-controller`` command."""

import sys

from fastpod_crd_controller.main import main

sys.exit(main())
