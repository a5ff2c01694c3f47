"""``python -m tmpatch.audit.calibrate``: :func:`tmpatch.audit.calibrate.cli.main`."""
from tmpatch.audit.calibrate.cli import main

raise SystemExit(main())
