"""``python -m fastgshare_cli`` runs the ``fastgshare`` command."""

from fastgshare_cli.main import main

raise SystemExit(main())
