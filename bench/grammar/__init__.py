"""Grammar-engine benchmark: compile time and per-token mask time of llguidance, xgrammar and
outlines-core on the same schemas and tokenizer (see __main__.py)."""
