from eagle_jax.infer.cli import main; import sys; sys.exit(main())
