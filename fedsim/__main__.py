import sys

from fedsim.cli import main

sys.exit(main())
