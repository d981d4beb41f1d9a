"""`python -m labs.grade`: see `labs.grade.cli`."""

import sys

from labs.grade.cli import main

sys.exit(main())
