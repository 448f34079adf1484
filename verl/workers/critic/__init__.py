"""The critic: a value model trained on the returns of the advantage estimator (GAE)."""
