"""verl's `verl.tools.utils` package paths: the tool YAML loader and the Search-R1 retrieval client."""
