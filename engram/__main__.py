import sys

from engram.cli import main

sys.exit(main())
