"""The embedding runtime: where tables live (storage, shm, hugepages), how they are loaded (loader),
who owns which rows (plan) and how rows are looked up (embedding)."""
