"""verl's `verl.experimental` module paths, kept as faces of Quiver's modules."""
