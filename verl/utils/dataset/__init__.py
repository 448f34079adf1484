"""Datasets in verl's parquet row schema: the RL prompt dataset and the synthetic arithmetic task."""
