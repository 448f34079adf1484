"""The byte sizes the memory estimate counts in, and how it prints them."""

GIB = 1024**3
FLOAT32_BYTES = 4
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}  # the run plan's dtype names


def gib(size: float) -> str:
    """Bytes for a person: GiB, or MiB below one GiB."""
    return f"{size / GIB:.2f} GiB" if size >= GIB else f"{size / 1024**2:.1f} MiB"
