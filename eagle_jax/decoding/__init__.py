"""Decoding: shared prompt and stop helpers, plain decoding, the draft tree, the lookup chain,
acceptance, sampling, and speculative decoding."""
