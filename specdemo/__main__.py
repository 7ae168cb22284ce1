import sys

from specdemo.cli import main

sys.exit(main())
