"""engram: Engram / PLE n-gram embedding tables for LLM serving."""
