"""`python -m specdemo <command>`: the command line of specdemo/cli.py (installed as the `specdemo` script too)."""
import sys

from specdemo.cli import main

if __name__ == "__main__":
    sys.exit(main())
