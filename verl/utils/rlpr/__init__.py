"""RLPR (verifier-free probability rewards, arXiv 2506.18254): the reward math and the reference-answer splicing."""
