"""Where a table shard lives: private host memory, huge pages or the device (storage), one copy per node
shared by the DP replicas (shm, memfd, node), or the checkpoint file itself (filemap)."""
