"""Draft-head training (installed as eagle_jax.train): `eagle-jax train` / `python -m eagle_jax.train`.

Modules by concern: data (conversations -> token ids + assistant loss mask), regenerate
(self-distillation), vocab (reduced draft vocabulary), features (target features, online or
offline), ttt (the draft unrolled: EAGLE-3 training-time test), losses, optim, mesh (device mesh,
multi-host batches), checkpoint (orbax), metrics, setup (run inputs and output directory),
trainer (the loop), cli.
"""
