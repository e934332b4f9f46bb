"""``python -m device_plugin`` runs ``fastgshare-node-agent``."""

from device_plugin.main import main

raise SystemExit(main())
