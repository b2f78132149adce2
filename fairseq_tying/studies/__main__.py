import sys

from fairseq_tying.studies.commands import main

sys.exit(main())
