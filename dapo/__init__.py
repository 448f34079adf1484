"""The Archer seeds' entry package: `python -m dapo.main_dapo` as their launch scripts call it."""
