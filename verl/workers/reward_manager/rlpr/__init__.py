"""RLPR (verifier-free probability rewards, arXiv 2506.18254), used by the prob reward manager: the reward math
(scoring), the reference-answer splicing (splice) and the debiasing term scoreA (score_a)."""
