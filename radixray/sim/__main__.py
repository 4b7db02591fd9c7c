import sys

from .sim_cli import main

sys.exit(main())
