"""Engine adapters beside the applications, calling the runtime: the vLLM plugin lands here."""
