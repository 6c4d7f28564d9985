"""One adapter per source: each turns a source's native format into one normalized, immutable sample."""
