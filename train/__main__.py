"""`python -m eagle_jax.train ...`: see eagle_jax.train.cli."""

import sys

from eagle_jax.train.cli import main

sys.exit(main())
