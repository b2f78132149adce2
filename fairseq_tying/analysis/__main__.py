import sys

from fairseq_tying.analysis import main

sys.exit(main())
