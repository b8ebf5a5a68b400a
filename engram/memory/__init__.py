"""The low floor: memory mappings that hold tables (mapping), what they cost (smaps), and what a node
can hold (host). Everything above (ops, ngram, runtime, config) may import these; they import none of it."""
