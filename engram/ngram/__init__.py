"""N-gram row ids: the compressed vocabulary (vocab), bucket primes and table layouts (primes, layout),
the hashers (hash), and a model's n-gram spec read from its HF text config (spec)."""
