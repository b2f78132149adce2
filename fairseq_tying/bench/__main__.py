import sys

from fairseq_tying.bench import main

result = main()
sys.exit(result if isinstance(result, int) else 0)
