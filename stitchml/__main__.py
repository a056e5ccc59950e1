"""`python -m stitchml ...` is the `stitchml` command."""
import sys

from .cli import main

sys.exit(main())
