"""DAPO (Yu et al. 2025): `python3 -m recipe.dapo.main_dapo` as in verl's recipe."""
