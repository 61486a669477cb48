import sys

from xmodal.cli import main

sys.exit(main())
