"""The project's own demo fixtures: a tiny Qwen2 model with an in-process tokenizer, and synthetic task data
(arithmetic word problems, tool-use tasks) that the CPU quickstart, the recipes' TINY mode, the benchmarks and the
tests train on, so that nothing is downloaded at run time."""
