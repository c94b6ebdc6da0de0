"""python -m edge_specdec.cli"""
import sys

from . import main

sys.exit(main())
