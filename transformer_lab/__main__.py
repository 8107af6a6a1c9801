"""``python -m transformer_lab ...``: see :mod:`transformer_lab.cli`."""

from transformer_lab.cli import main

raise SystemExit(main())
