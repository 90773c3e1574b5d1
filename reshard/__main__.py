import sys

from reshard.cli.main import main

sys.exit(main())
