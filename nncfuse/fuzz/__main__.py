"""`python -m nncfuse.fuzz`: see `cli.py`."""

from .cli import main

raise SystemExit(main())
