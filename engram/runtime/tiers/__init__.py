"""Tiers of hot rows that learn from the traffic: which rows of a shard a faster memory holds, chosen from
the ids actually served. Two tiers, chosen by what a miss costs, not by where the tier's rows live:

- **DeviceTier** (device.py) over a table in memory (on the GPU, in host memory the GPU reads over UVA,
  or a checkpoint file on tmpfs or hugetlbfs, which is memory too): device_cache_bytes. A miss costs a
  read of memory, so the tier can afford to choose slowly: it keeps a window of the ids served and, between
  steps, the rows of highest decayed frequency (WindowedAdmission, windowed.py: LFU with decay, as TinyLFU
  admits). Its state is device tensors that a captured CUDA graph reads in place.
- **RamTier** (ram.py) over a checkpoint file on disk: ram_cache_bytes. A miss costs a disk read, so the
  tier admits a row right after the lookup that read it (from the page cache, or straight from the disk
  past it), and evicts by CLOCK (ClockAdmission, clock.py). Host memory only.

A file on tmpfs or hugetlbfs takes no RAM tier: its rows already are RAM, and copying them to private RAM
would hold them twice; device_cache_bytes serves it as any host table. A file on disk takes no device
tier, on any device: a miss there is a disk read. open.py decides a tier's kind and words the refusals,
once (kind_of, refusal). A RAM tier stands aside where memory is to spare (ram.py).

The parts both stand on: the budget arithmetic (budget.py), the slots and counters (base.py), what an
admission changes (choice.py), the hit-or-miss gather over a tier's rows (hot_rows.py), a profile's warm
start (profile.py); `assign.keep_hot` gives a rank's tables their tiers as the config says, for engram's
engine and the vLLM plugin alike."""
