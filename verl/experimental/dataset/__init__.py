"""verl's `verl.experimental.dataset` path: the bases of a user's training sampler (`data.sampler`)."""
