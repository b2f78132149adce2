import sys

from fairseq_tying.common.extras import run_main

sys.exit(run_main("fairseq_tying.analysis"))
