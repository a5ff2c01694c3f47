"""``python -m tmpatch``: the ``tmpatch`` command (see :mod:`tmpatch.cli`)."""
from tmpatch.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
