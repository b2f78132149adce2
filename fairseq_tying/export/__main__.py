import sys

from fairseq_tying.export import main

sys.exit(main())
