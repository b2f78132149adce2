import sys

from fairseq_tying.evaluation.cli import main

sys.exit(main())
