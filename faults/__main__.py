import sys

from faults.cli import main

sys.exit(main())
